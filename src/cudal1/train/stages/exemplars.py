"""Seeding a GRPO run's exemplar pool with the verified programs of earlier runs
(``train grpo --exemplars-from RUN ...``).

Contract: :func:`seed_pool` reads each source — a run directory (``cudal1.sqlite`` in it: an SSL
or GRPO run, ``cudal1 optimize`` or ``cudal1 evaluate``), a run store file, or a ``collect``
output ``DATA.jsonl`` (its store ``DATA.sqlite`` beside it) — and, for every task of the run found
there by task hash, takes its **verified** programs: an ``ok`` verdict, the task not flagged
``degenerate_task``, no ``reviewer_suspects`` flag, never the reference anchor; distinct programs,
fastest first, at most ``per_task`` per task over all sources.  Each is proposed to the run's
:class:`~cudal1.recorded.RecordedJudge` (candidate provenance ``policy: seed``, ``from: SOURCE``)
and judged **here, under this run's judge config**, so the speedups the prompts show are
measured like every rollout's: a source verdict recorded under the same judge config
(``config_hash``) is adopted (:meth:`~cudal1.recorded.RecordedJudge.adopt`) instead of judged
again; any other verdict only chooses what to seed.

Sources are read, never written: each store is opened read-only.  A source that is missing or not
a run store raises :class:`SeedError` (one line) before anything is judged.

Not covered: tasks are matched by their hash (their source text); a task whose text differs
between the runs is not seeded.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cudal1.recorded import RecordedJudge
from cudal1.types import Candidate, EvalResult, Status, Task, reference_candidate

log = logging.getLogger(__name__)

SEED_POLICY = "seed"
EXCLUDED_FLAGS = frozenset({"degenerate_task", "reviewer_suspects"})


class SeedError(ValueError):
    """An unusable ``--exemplars-from`` source (one line)."""


def store_file(source: str | Path) -> Path:
    """The run store of a source (see the module docstring); :class:`SeedError` when there is none."""
    path = Path(source)
    if path.is_dir():
        path = path / "cudal1.sqlite"
    elif path.suffix == ".jsonl":
        path = path.with_name(path.stem + ".sqlite")
    if not path.is_file():
        raise SeedError(f"--exemplars-from {source}: no run store there (expected a run directory, a .sqlite store "
                        "or a collect output .jsonl with its .sqlite beside it)")
    return path


def _verified(res: EvalResult) -> bool:
    return (res.status is Status.OK and res.speedup is not None and res.speedup > 0
            and not EXCLUDED_FLAGS & set(res.flags or []))


def _open_read_only(path: Path, source: str | Path) -> sqlite3.Connection:
    """``path`` opened read-only; a WAL store whose folder cannot take its index file (a read-only
    copy) as an immutable snapshot."""
    base = f"file:{quote(str(path.resolve()))}?mode=ro"
    for uri in (base, base + "&immutable=1"):
        try:
            conn = sqlite3.connect(uri, uri=True)
            conn.execute("SELECT 1 FROM candidates LIMIT 1")
            return conn
        except sqlite3.OperationalError:
            continue
        except sqlite3.DatabaseError as exc:
            raise SeedError(f"--exemplars-from {source}: {path} is not a run store ({exc})") from None
    raise SeedError(f"--exemplars-from {source}: cannot read {path} as a run store")


def read_verified(source: str | Path, task_hashes: set[str]) -> dict[str, list[tuple[Candidate, EvalResult]]]:
    """Per task hash, the verified (candidate, verdict) pairs a source holds (read-only)."""
    path = store_file(source)
    conn = _open_read_only(path, source)
    try:
        sources = {(t, h): (src, label) for t, h, src, label in conn.execute(
            "SELECT task_hash, hash, source, label FROM candidates")}
        out: dict[str, list[tuple[Candidate, EvalResult]]] = {}
        for th, ch, blob in conn.execute("SELECT task_hash, candidate_hash, result_json FROM evaluations ORDER BY id"):
            if th not in task_hashes or (th, ch) not in sources:
                continue
            res = EvalResult.from_dict(json.loads(blob))
            src, label = sources[(th, ch)]
            out.setdefault(th, []).append((Candidate(src, task_hash=th, label=label), res))
    except sqlite3.DatabaseError as exc:
        raise SeedError(f"--exemplars-from {source}: {path} is not a run store ({exc})") from None
    finally:
        conn.close()
    return out


def choose(
    tasks: list[Task], sources: list[str | Path], per_task: int
) -> dict[str, list[tuple[Candidate, EvalResult, str]]]:
    """Per task hash, the programs to seed: verified, distinct, fastest first, ``per_task`` at most;
    each with the verdict it was chosen by and its source."""
    hashes = {t.hash for t in tasks}
    degenerate: set[str] = set()
    found: dict[str, dict[str, tuple[Candidate, EvalResult, str]]] = {}
    for source in sources:
        for th, pairs in read_verified(source, hashes).items():
            for cand, res in pairs:
                if "degenerate_task" in (res.flags or []):
                    degenerate.add(th)
                if not _verified(res):
                    continue
                best = found.setdefault(th, {}).get(cand.hash)
                if best is None or res.speedup > best[1].speedup:  # type: ignore[operator]
                    found[th][cand.hash] = (cand, res, str(source))
    anchors = {t.hash: reference_candidate(t).hash for t in tasks}
    chosen = {}
    for th, by_hash in found.items():
        if th in degenerate:
            continue
        ranked = sorted((v for h, v in by_hash.items() if h != anchors[th]), key=lambda v: -v[1].speedup)  # type: ignore[operator]
        chosen[th] = ranked[:per_task] if per_task > 0 else ranked
    return chosen


def seed_pool(judge: RecordedJudge, tasks: list[Task], sources: list[str | Path], per_task: int = 4) -> dict[str, Any]:
    """Seed ``judge``'s pool (see the module docstring).  Returns ``{"sources", "tasks",
    "seeded", "reused", "judged", "ok"}``: tasks seeded, programs seeded, verdicts adopted, judged
    anew, and how many of those are ``ok`` here."""
    for source in sources:
        store_file(source)  # every source checked before anything is judged
    by_hash = {t.hash: t for t in tasks}
    chosen = choose(tasks, sources, per_task)
    pairs, reused = [], 0
    for th, picks in chosen.items():
        task = by_hash[th]
        for cand, res, source in picks:
            judge.propose(task, cand, {"round": 0, "policy": SEED_POLICY, "from": source})
            reused += judge.adopt(task, cand, res)  # judged under this config already: not judged again
            pairs.append((task, cand))
    verdicts = judge.judge(pairs) if pairs else []
    summary = {"sources": [str(s) for s in sources], "tasks": len(chosen), "seeded": len(pairs), "reused": reused,
               "judged": len(pairs) - reused, "ok": sum(1 for r in verdicts if r.status is Status.OK)}
    log.info("exemplar pool seeded: %s", summary)
    return summary


__all__ = ["SEED_POLICY", "SeedError", "choose", "read_verified", "seed_pool", "store_file"]
