"""Re-timing for ``benchmarks/builtin_kernelbench.py --confirm``: each finished task's builtin winner
and its best torch.compile mode, judged once more with fresh inputs, outside the run store.

Why: the best of several noisy measurements is biased upward — for the builtin (best of its
candidates) and for torch.compile (best of its modes) alike; an independent re-measurement of both
is not.  The winner is judged as a candidate (fresh secret inputs, fresh timing), the mode as a
baseline (the reference under that mode against eager), both in one batch, by a judge with its own
worker count (``--confirm-workers-per-gpu``; its timing and the candidate's first call hold the GPU
alone at any count).  Results go to
``OUT/confirm.json`` one by one (``task|candidate hash`` and ``task|mode:NAME`` keys), so a killed
confirmation resumes where it stopped.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

from builtin_baseline_plan import write_whole
from builtin_figures import counted, retimed_key
from cudal1.config import EvalConfig
from cudal1.store import RunStore


def save_confirmed(out: Path, done: dict[str, Any]) -> None:
    """``OUT/confirm.json``, written whole, then renamed."""
    write_whole(out / "confirm.json", json.dumps(done, indent=1))


def confirm_entry(res: Any) -> dict[str, Any]:
    """What ``OUT/confirm.json`` keeps of a re-timing's verdict (``wall_s``, ``phase_s`` and ``at``,
    its recording time on the wall clock: :mod:`builtin_cost`)."""
    return {"status": res.status.value, "speedup": res.speedup, "speedup_ci": res.speedup_ci,
            "flags": res.flags, "wall_s": res.wall_s, "phase_s": res.phase_s, "at": time.time()}


def confirm(out: Path, tasks: list, rows: list[dict], judge: EvalConfig, plan: Any,
            on_stats: Callable[[str, Any], None] | None = None, tick: Callable[[Any], None] | None = None) -> int:
    """Re-judge what ``rows`` (:func:`builtin_figures.task_rows`) name for finished, non-degenerate
    tasks and not yet in ``OUT/confirm.json``, in one batch; returns how many were judged."""
    from cudal1.harness import Job, run_jobs
    from cudal1.harness.baselines import check_modes

    path = out / "confirm.json"
    done: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    by_id = {t.task_id: t for t in tasks}
    store = RunStore(out / "cudal1.sqlite")
    try:
        pairs, keys = [], []
        modes = []
        for r in rows:
            if not counted(r):
                continue
            task = by_id[r["task"]]
            if r["best_hash"] and retimed_key(task.task_id, candidate=r["best_hash"]) not in done:
                cand = next(c for c in store.candidates(task.hash) if c.hash == r["best_hash"])
                pairs.append((task, cand))
                keys.append(retimed_key(task.task_id, candidate=r["best_hash"]))
            if r["best_mode"] and retimed_key(task.task_id, mode=r["best_mode"]) not in done:
                modes.append((task, r["best_mode"]))
    finally:
        store.close()

    lock = threading.Lock()  # verdicts arrive from the lane threads

    def record(key: str, res: Any) -> None:
        with lock:
            done[key] = confirm_entry(res)
            save_confirmed(out, done)
        if tick is not None:
            tick(res)

    if not pairs and not modes:
        return 0
    print(f"confirming {len(pairs)} winner(s) and re-timing {len(modes)} best compile mode(s) with fresh inputs",
          flush=True)
    check_modes(sorted({m for _, m in modes}), plan.device)
    # one batch for both (its lanes take the longest task's jobs first): winners as candidates, modes as baselines
    jobs = [Job(t, c) for t, c in pairs] + [Job(t, None, m) for t, m in modes]
    keys += [retimed_key(t.task_id, mode=m) for t, m in modes]
    run_jobs(jobs, judge, plan=plan, on_result=lambda i, res: record(keys[i], res),
             on_stats=(lambda s: on_stats("confirm", s)) if on_stats else None)
    return len(jobs)
