"""A chunk's baselines and its re-timing as one batch (``builtin_kernelbench.py --finish joined``;
without ``--confirm``, the baselines alone, whose graphed modes still join as they are due):
each job joins the batch once the verdicts it depends on are in, so the re-timings, which are
mostly GPU work, run while the baselines' compiles, which are mostly CPU work, leave the GPU idle,
and the chunk's work after its search has one end where lanes run dry instead of three (the
baselines' two phases, then the re-timing).

Per task, the same jobs as the staged code (:func:`builtin_kernelbench.time_baselines`, then
:func:`builtin_confirm.confirm`), added as their inputs become known:

- at once: the re-timing of the search's winner (a candidate, fresh inputs), where the search
  found a verified best and the task is not degenerate, and the modes of the baseline plan's first
  phase (:func:`builtin_baseline_plan.phases`, minus what the plan skips and what the store holds);
- once the task's first phase is judged: the graphed compile modes the plan keeps (its graph rule
  reads the task's ``cudagraph`` verdict);
- once every baseline of the task is judged: the task is listed in ``OUT/baselines_done.json`` and
  its best compile mode is re-timed (a baseline job, recorded outside the store).

Verdicts go where the staged code puts them (baselines: the run store; re-timings:
``OUT/confirm.json``), so a call cut anywhere is resumed by either code.  One judge times both:
the re-timing's workers per GPU must be the search's (the caller checks).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable

import builtin_baseline_plan
from builtin_confirm import confirm_entry, save_confirmed
from builtin_figures import counted, retimed_key, task_rows

BASELINE = "baseline:"


def searched_out(row: dict[str, Any]) -> bool:
    """The task's search is finished, it is not degenerate and it has a verified winner: its
    re-timing need not wait for the baselines."""
    return counted({**row, "baselines_pending": 0}) and bool(row["best_hash"])


class Finish:
    """The jobs of one chunk's baselines and re-timing, and the ones each verdict makes possible
    (:meth:`follow`, called by the batch from its lane threads)."""

    def __init__(self, out: Path, rj: Any, chunk: list, modes: list[str], config_hash: str,
                 retime: bool = True) -> None:
        self.out, self.rj, self.modes, self.config_hash, self.retime = out, rj, modes, config_hash, retime
        self.phases = builtin_baseline_plan.phases(modes)
        self.tasks = {t.hash: t for t in chunk}
        self.chunk = chunk
        path = out / "confirm.json"
        self.confirmed: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        self.phase: dict[str, int] = {}  # task hash -> the baseline phase its jobs are in
        self.awaited: dict[str, set[str]] = {}  # task hash -> that phase's modes without a verdict yet
        self.lock = threading.Lock()

    def start(self) -> list[Any]:
        """The jobs that need no verdict first: each task's winner re-timing and first baseline
        phase (a task whose baselines are all in the store: its mode re-timing), the baselines
        mode by mode and the winners spread among them."""
        rows = task_rows(self.out, self.chunk, self.config_hash, {}, self.modes)
        winners, baselines = [], []
        for task, row in zip(self.chunk, rows):
            if self.retime:
                winners += self.winner(task, row)
            baselines += self.advance(task, row, 0)
        order = {m: k for k, m in enumerate(self.modes)}
        baselines.sort(key=lambda j: order.get(j.baseline_mode, len(order)))  # stable: mode by mode
        jobs: list[Any] = []
        for k in range(max(len(winners), len(baselines))):
            jobs += baselines[k:k + 1] + winners[k:k + 1]
        return jobs

    def follow(self, index: int, res: Any) -> list[Any]:
        """Record one verdict where the staged code would, and return the jobs it makes possible."""
        with self.lock:
            task = self.tasks[res.task_hash]
            mode = res.candidate_hash[len(BASELINE):] if res.candidate_hash.startswith(BASELINE) else None
            waiting = self.awaited.get(task.hash, set())
            if mode is not None and mode in waiting:  # a baseline (its re-timing is added only after it)
                self.rj.keep_baseline(res)
                waiting.discard(mode)
                if waiting:
                    return []
                return self.advance(task, self.row(task), self.phase[task.hash] + 1)
            self.confirmed[retimed_key(task.task_id, candidate=res.candidate_hash, mode=mode)] = confirm_entry(res)
            save_confirmed(self.out, self.confirmed)
            return []

    def advance(self, task: Any, row: dict[str, Any], phase: int) -> list[Any]:
        """The jobs of the task's first baseline phase from ``phase`` on that has any left to time
        (its skips recorded); past the last phase: the task's baselines are done, and its best
        compile mode's re-timing is the job left."""
        from cudal1.harness import Job

        while phase < len(self.phases):
            todo, skipped = builtin_baseline_plan.plan([row], self.phases[phase])
            builtin_baseline_plan.record_skips(self.out, skipped)
            _, left = self.rj.baselines_to_time([(task, mode) for _, mode in todo])
            if left:
                self.phase[task.hash] = phase
                self.awaited[task.hash] = {mode for _, mode in left}
                return [Job(task, None, mode) for _, mode in left]
            phase += 1  # nothing was judged: the row still holds
        builtin_baseline_plan.record_done(self.out, [task.task_id])
        return self.mode_retiming(task, self.row(task)) if self.retime else []

    def winner(self, task: Any, row: dict[str, Any]) -> list[Any]:
        from cudal1.harness import Job

        if not searched_out(row) or retimed_key(task.task_id, candidate=row["best_hash"]) in self.confirmed:
            return []
        cand = next(c for c in self.rj.store.candidates(task.hash) if c.hash == row["best_hash"])
        return [Job(task, cand)]

    def mode_retiming(self, task: Any, row: dict[str, Any]) -> list[Any]:
        from cudal1.harness import Job

        mode = row["best_mode"]
        if not counted(row) or not mode or retimed_key(task.task_id, mode=mode) in self.confirmed:
            return []
        return [Job(task, None, mode)]

    def row(self, task: Any) -> dict[str, Any]:
        return task_rows(self.out, [task], self.config_hash, {}, self.modes)[0]


def finish(out: Path, rj: Any, chunk: list, modes: list[str], config_hash: str, *, retime: bool = True,
           on_result: Callable[[Any], None] | None = None, on_stats: Callable[[Any], None] | None = None) -> int:
    """Judge the chunk's baselines (and with ``retime`` its re-timing) in one batch of ``rj``'s
    judge; returns how many jobs were judged."""
    from cudal1.harness import run_jobs

    work = Finish(out, rj, chunk, modes, config_hash, retime)
    jobs = work.start()
    if not jobs:
        return 0
    print(f"baselines{' and re-timing' if retime else ''} of {len(chunk)} task(s) in one batch: {len(jobs)} job(s) "
          "to start with, the rest as their verdicts come in", flush=True)
    rj.prime_batches()
    done = run_jobs(jobs, rj.config, plan=rj.device_plan(),
                    on_result=(lambda i, res: on_result(res)) if on_result else None,
                    on_stats=on_stats, follow=work.follow)
    return len(done)
