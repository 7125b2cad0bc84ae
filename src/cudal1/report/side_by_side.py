"""Two sets of results side by side: runs, exported files, published release files, verify reports.

Contract: :func:`read_side` turns one input into per-task speedups over eager (``None`` where the
input has no verified program for the task):

* a run directory or store: each task's best verified speedup (degenerate tasks left out);
* a ``.jsonl`` in CUDA-L1's release format (``cudal1 export`` output or a published release):
  ``score_default`` of each record with ``custom_code`` (claimed figures, as published);
* a ``verify_report.json`` (``cudal1 verify``): the measured speedup of each verified record.

Tasks are matched by id (``level1/48``, or a user task's name).  :func:`compare` gives per task
both values and B / A, and in aggregate each side's figures over its own tasks
(:func:`cudal1.report.aggregate.summarize`) and, over the tasks both hold, the geomeans and B's
wins, ties and losses.  For wins a missing program counts 1.0x (the reference is kept) and a
difference must exceed 1% (CUDA-L1's 1.01x rule) to count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.report.aggregate import CONVENTIONS, geomean, summarize
from cudal1.report.load import ReportError, load_runs

MARGIN = 1.01


@dataclass
class Side:
    label: str
    kind: str  # run | release | verify
    speedups: dict[str, float | None] = field(default_factory=dict)
    levels: dict[str, int | None] = field(default_factory=dict)


def _release(path: Path) -> Side:
    from cudal1.report.verify import VerifyError, read_records

    try:
        records = read_records(path)
    except VerifyError as exc:
        raise ReportError(str(exc)) from None
    side = Side(str(path), "release")
    for r in records:
        side.speedups[r.key] = r.claimed if r.code is not None else None
        side.levels[r.key] = r.level
    return side


def _verify_report(path: Path) -> Side:
    try:
        doc = json.loads(path.read_text())
        rows = doc["records"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"cannot read {path} as a verify report: {exc}") from None
    side = Side(str(path), "verify")
    for r in rows:
        if r.get("class") == "degenerate_task":
            continue
        ok = r.get("status") == "ok" and r.get("class") in ("verified", "slower_than_claimed")
        side.speedups[r["task"]] = r.get("measured") if ok else None
        side.levels[r["task"]] = r.get("level")
    return side


def _run(path: Path) -> Side:
    from cudal1.report.document import outcome

    side = Side(str(path), "run")
    for rec in load_runs([path]).tasks:
        o = outcome(rec)
        if not o.degenerate:
            side.speedups[o.task] = o.best
            side.levels[o.task] = o.level
    return side


def read_side(path: str | Path) -> Side:
    p = Path(path)
    if not p.exists():
        raise ReportError(f"no run or file at {path}")
    if p.is_dir() or p.suffix in (".sqlite", ".db"):
        return _run(p)
    if p.suffix == ".json":
        return _verify_report(p)
    return _release(p)


def compare(a: Side, b: Side) -> dict[str, Any]:
    """Per-task rows and aggregate figures of ``a`` and ``b`` (see the module docstring)."""
    keys = sorted(set(a.speedups) | set(b.speedups),
                  key=lambda k: (a.levels.get(k, b.levels.get(k)) is None, a.levels.get(k, b.levels.get(k)) or 0, k))
    rows = []
    wins = ties = losses = 0
    for k in keys:
        va, vb = a.speedups.get(k), b.speedups.get(k)
        both = k in a.speedups and k in b.speedups
        rows.append({"task": k, "level": a.levels.get(k, b.levels.get(k)), "a": va, "b": vb,
                     "b_over_a": vb / va if va and vb else None, "in_both": both})
        if both:
            ra, rb = va or 1.0, vb or 1.0
            wins += rb > ra * MARGIN
            losses += ra > rb * MARGIN
            ties += not (rb > ra * MARGIN or ra > rb * MARGIN)
    common = [r for r in rows if r["in_both"]]
    return {
        "a": {"source": a.label, "kind": a.kind, **summarize(list(a.speedups.values()))},
        "b": {"source": b.label, "kind": b.kind, **summarize(list(b.speedups.values()))},
        "common": {"tasks": len(common),
                   "a_geomean": geomean([r["a"] for r in common]), "b_geomean": geomean([r["b"] for r in common]),
                   "a_geomean_cuda_l1": geomean([CONVENTIONS["cuda-l1"].value(r["a"]) for r in common]),
                   "b_geomean_cuda_l1": geomean([CONVENTIONS["cuda-l1"].value(r["b"]) for r in common]),
                   "b_wins": wins, "ties": ties, "b_losses": losses},
        "tasks": rows,
    }
