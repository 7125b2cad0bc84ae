"""What an optimize run leaves in ``OUT``: ``best/<task>.py`` and ``summary.json``.

Contract: one row per task with the best verified candidate (the highest measured ``ok``
speedup; never the reference anchor; none on a degenerate task) — the same pick as ``cudal1
report``'s ``best_speedup`` for the run — with its 95% CI and whether it is faster with
confidence (:mod:`cudal1.speedup`).  ``best/`` receives a task's best only when it was measured
faster than the reference (point value above 1.0), so it never holds a slower program.  The
summary counts tasks faster with confidence (``faster``) and by point value alone
(``faster_point``), and records the run's generation requests and failures (``generation``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cudal1.speedup import clears, noisy, uncertain
from cudal1.tables import geomean

if TYPE_CHECKING:
    from cudal1.search.loop import Search


def task_row(s: Search, task: Any, best_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary row, environment of one verdict) of ``task``; writes its ``best/`` file."""
    from cudal1.recorded import is_degenerate

    pairs = s.judge.results(task)
    statuses: dict[str, int] = {}
    for _, r in pairs:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    environment = dataclasses.asdict(pairs[0][1].environment) if pairs else {}
    best = s.judge.best(task)
    path = best_dir / f"{task.task_id.replace('/', '_')}.py"
    speedup = ci = None
    if best is not None:
        speedup, ci = best[1].speedup, best[1].speedup_ci
    if speedup is not None and speedup > 1.0:
        path.write_text(best[0].source)  # type: ignore[index]
    else:
        path.unlink(missing_ok=True)  # an earlier run's file for a best no longer measured faster
        path = None  # type: ignore[assignment]
    row = {"task": task.task_id, "best_speedup": speedup, "best_ci": list(ci) if ci else None,
           "faster": clears(speedup, ci), "uncertain": uncertain(speedup, ci),
           "high_variance": bool(best and noisy(best[1])), "best_path": str(path) if path else None,
           "evaluated": len(pairs), "statuses": statuses, "degenerate": is_degenerate(pairs)}
    return row, environment


def write_outputs(s: Search, out: Path, stop: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``best/<task>.py`` for each task with a candidate measured faster, and ``summary.json``
    (with the caller's ``extra`` keys)."""
    best_dir = out / "best"
    best_dir.mkdir(exist_ok=True)
    rows, environment = [], {}
    for task in s.tasks:
        row, env = task_row(s, task, best_dir)
        rows.append(row)
        environment = environment or env
    store = s.judge.store
    answered = failed = 0
    for task in s.tasks:
        for a, f in (store.round_counts(task.hash).values() if store is not None else ()):
            answered, failed = answered + a, failed + f
    gen = s.generation
    summary = {"tasks": rows, "environment": environment, "stopped_by": stop or "rounds",
               "geomean_best_speedup": geomean([r["best_speedup"] for r in rows]),
               "faster": sum(1 for r in rows if r["faster"]),
               "faster_point": sum(1 for r in rows if r["best_speedup"] is not None and r["best_speedup"] > 1.0),
               "generation": {"requested": gen.requested, "failed": gen.failed, "last_error": gen.last_error,
                              "errors": gen.errors, "answered_total": answered, "failed_total": failed},
               "judge_hash": s.judge.config_hash,
               # this invocation's judging (a resumed run counts only what it judged itself)
               "judging": s.judge.judging_summary(),
               **(extra or {})}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
