"""What an optimize run leaves in ``OUT``: ``best/<task>.py``, ``candidates/<task>.py`` and ``summary.json``.

Contract: one row per task.  Its **best** is the candidate a user should keep: among the task's
verified (``ok``) candidates, those measured faster than the reference with confidence (95% CI
above 1.0, :mod:`cudal1.speedup`) come first, then the highest measured speedup; never the
reference anchor, none on a degenerate task.  ``cudal1 report`` picks each task's best the same
way.  ``best/<task>.py`` holds the best only when it was measured faster (``best_path``), so
best/ never holds a program the run itself does not call faster.  The highest-measured candidate
that was *not* measured faster but whose point value is above 1.0 and above the best's (it may
be faster; the run could not tell) is kept apart in ``candidates/<task>.py`` and named in the
row (``uncertain_candidate``: path, speedup, CI).  Files of an earlier run that no longer
qualify are removed.

``judged`` counts the task's candidates with a verdict under the run's judge settings: the
reference itself (round 0's 1.00x anchor) is not counted, and a program proposed twice is
counted once (``cudal1 report`` counts the same; ``statuses`` are over the same candidates).
The summary says why the run ended (``stopped_by``: ``rounds``, a budget, or ``interrupted`` when
SIGINT cut it and the summary holds what was judged so far), counts tasks faster with confidence
(``faster``) and by point value alone (``faster_point``), and records the run's generation
requests, failures and retries (``generation``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cudal1.speedup import clears, faster, noisy, uncertain
from cudal1.tables import geomean

if TYPE_CHECKING:
    from cudal1.search.loop import Search


def _keep(path: Path, source: str | None) -> str | None:
    """Write ``source`` at ``path`` (its path as a string), or remove an earlier run's file there (None)."""
    if source is None:
        path.unlink(missing_ok=True)
        return None
    path.parent.mkdir(exist_ok=True)
    path.write_text(source)
    return str(path)


def task_row(s: Search, task: Any, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary row, environment of one verdict) of ``task``; writes (or removes) its ``best/``
    and ``candidates/`` files."""
    from cudal1.recorded import best_of, is_degenerate
    from cudal1.types import reference_candidate

    pairs = s.judge.results(task)
    anchor = reference_candidate(task).hash
    judged = [(c, r) for c, r in pairs if c.hash != anchor]
    statuses: dict[str, int] = {}
    for _, r in judged:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    environment = dataclasses.asdict(pairs[0][1].environment) if pairs else {}
    top = best_of(task, pairs)
    sure = best_of(task, [(c, r) for c, r in pairs if faster(r)]) if top is not None else None  # None: degenerate
    best = sure or top
    maybe = top if top is not None and not faster(top[1]) and (top[1].speedup or 0.0) > 1.0 else None
    name = f"{task.task_id.replace('/', '_')}.py"
    best_path = _keep(out / "best" / name, sure[0].source if sure else None)
    maybe_path = _keep(out / "candidates" / name, maybe[0].source if maybe else None)
    speedup, ci = (best[1].speedup, best[1].speedup_ci) if best else (None, None)
    row = {"task": task.task_id, "best_speedup": speedup, "best_ci": list(ci) if ci else None,
           "faster": clears(speedup, ci), "uncertain": uncertain(speedup, ci),
           "high_variance": bool(best and noisy(best[1])), "best_path": best_path,
           "uncertain_candidate": {"path": maybe_path, "speedup": maybe[1].speedup,
                                   "ci": list(maybe[1].speedup_ci) if maybe[1].speedup_ci else None} if maybe else None,
           "judged": len(judged), "statuses": statuses, "degenerate": is_degenerate(pairs)}
    return row, environment


def write_outputs(s: Search, out: Path, stop: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``best/`` and ``candidates/`` files and ``summary.json`` (with the caller's ``extra`` keys;
    see the module docstring)."""
    (out / "best").mkdir(exist_ok=True)
    rows, environment = [], {}
    for task in s.tasks:
        row, env = task_row(s, task, out)
        rows.append(row)
        environment = environment or env
    answered = failed = 0
    for task in s.tasks:
        for a, f in s.judge.round_counts(task).values():
            answered, failed = answered + a, failed + f
    gen = s.generation
    summary = {"tasks": rows, "environment": environment, "stopped_by": stop or "rounds",
               "geomean_best_speedup": geomean([r["best_speedup"] for r in rows]),
               "faster": sum(1 for r in rows if r["faster"]),
               "faster_point": sum(1 for r in rows if r["best_speedup"] is not None and r["best_speedup"] > 1.0),
               "generation": {"requested": gen.requested, "failed": gen.failed, "last_error": gen.last_error,
                              "retries": getattr(s.policy, "retries", 0),
                              "errors": gen.errors, "answered_total": answered, "failed_total": failed},
               "judge_hash": s.judge.config_hash,
               # this invocation's judging (a resumed run counts only what it judged itself)
               "judging": s.judge.judging_summary(),
               **(extra or {})}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
