"""A batch on this machine: every build handed to the build farm at once, one thread per timing
lane (or several sharing a GPU), verdicts in job order.

Contract: :func:`run_jobs` is the harness's batch entry (``plan.backend == "ray"`` hands the same
jobs to :mod:`cudal1.harness.parent.ray_backend`).  A lane takes a *ready* job (no build, or its
build finished) and sleeps until a build finishes when none is; it never commits to a build that
has not started.  With several workers per GPU, a job that ran out of memory beside its
neighbours is judged again with the GPU to itself (:class:`GpuGate`, flag ``rejudged_alone``),
and its later jobs are judged alone at once (``TASK_MEMORY`` of
:mod:`cudal1.harness.parent.gpu_memory`, which keeps such tasks, and each task's measured memory,
in the cache directory across processes) — unless its memory is known: then a job enters beside
the others once its share fits in the GPU's memory beside the running jobs'
(:meth:`GpuGate.enter`; other jobs enter as before, their shares counted); a task whose share
leaves no room beside another (one that ran out of memory within its share is given the whole
GPU's) runs alone.
Among ready jobs, a lane takes the one whose task took longest so far in this process
(``TASK_SECONDS`` of :mod:`cudal1.harness.parent.task_seconds`), so a batch's long jobs do not end
it with the other lanes idle.
A drain (:mod:`cudal1.harness.parent.drain`) lets running jobs finish, starts no other, and raises
``Drained`` for those it never started; under a drain's deadline a lane starts only jobs expected
to end before it (``TaskSeconds.expected``), and once none is left the drain begins.
``on_result(index, result)`` is called from a lane thread as each verdict arrives, ``on_stats``
once after the batch (:class:`~cudal1.harness.parent.batchstats.BatchStats`).  ``follow(index,
result)``, where given, is called next, from the same thread: the jobs it returns (those the
verdict made possible) join the batch, numbered after every job so far, and the batch ends once no
job is pending or running; a lane with nothing ready waits for them meanwhile.  Ray's backend runs
them as a later batch (:func:`~cudal1.harness.parent.ray_backend.in_rounds`).  An interrupt stops
every lane and kills running workers; their jobs leave no verdict.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from cudal1.config import EvalConfig
from cudal1.harness import build
from cudal1.harness.parent import drain, gpu_memory, task_seconds
from cudal1.harness.parent.batchstats import BatchStats, StatsRecorder, in_worker_build_s
from cudal1.harness.parent.blocked import blocked_sides, worth_judging_alone
from cudal1.harness.parent.evaluator import Evaluator
from cudal1.harness.parent.gpu_memory import GpuGate, out_of_memory, runs_alone
from cudal1.harness.parent.plan import BACKENDS, DevicePlan, HarnessError, Job
from cudal1.types import EvalResult


def run_jobs(
    jobs: list[Job],
    config: EvalConfig,
    *,
    plan: DevicePlan | None = None,
    on_result: Callable[[int, EvalResult], None] | None = None,
    on_stats: Callable[[BatchStats], None] | None = None,
    follow: Callable[[int, EvalResult], list[Job]] | None = None,
) -> list[EvalResult]:
    """Evaluate ``jobs``: parallel pre-builds, one timing lane per GPU.  Order is preserved.
    ``on_result(index, result)`` is called from a lane thread as each verdict arrives;
    ``on_stats(stats)`` once, after the batch.  ``follow(index, result)``: the jobs a verdict makes
    possible, judged in the same batch (results: ``jobs``, then the followed jobs in the order
    they were returned)."""
    plan = plan or DevicePlan.detect(config.device)
    if plan.backend == "ray":
        from cudal1.harness.parent.ray_backend import run_jobs_ray

        return run_jobs_ray(jobs, config, plan=plan, on_result=on_result, on_stats=on_stats, follow=follow)
    if plan.backend != "local":
        raise HarnessError(f"unknown backend {plan.backend!r}; known: {', '.join(BACKENDS)}")
    return _LocalBatch(jobs, config, plan, on_result, follow).run(on_stats)


class _LocalBatch:
    """One batch on this machine: a build farm feeding one thread per timing lane."""

    def __init__(self, jobs: list[Job], config: EvalConfig, plan: DevicePlan,
                 on_result: Callable[[int, EvalResult], None] | None,
                 follow: Callable[[int, EvalResult], list[Job]] | None = None) -> None:
        from cudal1.harness.parent.farm import BuildBudget

        self.jobs, self.config, self.plan, self.on_result = list(jobs), config, plan, on_result
        self.follow = follow
        self.running = 0  # jobs taken and not yet judged (their verdicts may add jobs: follow)
        self.budget = BuildBudget.detect(config.build_workers, len(plan.lanes) * config.workers_per_gpu)
        self.ev = Evaluator(config, plan, max_jobs=self.budget.max_jobs)
        self.rec = StatsRecorder("local", jobs, self.budget.workers, self.budget.max_jobs)
        self.ev.on_timeline = self.rec.gpu_phases
        self.results: list[EvalResult | None] = [None] * len(self.jobs)
        self.pending = list(range(len(self.jobs)))
        self.ready = threading.Condition()
        self.failures: list[BaseException] = []
        self.stopping = False  # set when the batch is interrupted: lanes take nothing more, drop what runs
        self.farm: Any = None
        self.tickets: dict[int, Any] = {}  # job -> farm.Ticket
        shared = config.workers_per_gpu > 1  # one job per GPU: no neighbour's memory to count
        self.gates = {gpu: GpuGate(gpu_memory.gpu_capacity_mib(gpu) if shared else 0) for gpu in plan.lanes}
        if shared:
            gpu_memory.TASK_MEMORY.attach(config.cache_root())

    def run(self, on_stats: Callable[[BatchStats], None] | None) -> list[EvalResult]:
        from cudal1.harness.parent.farm import BuildFarm

        farm = self.farm = BuildFarm(self.ev.prebuild, self.ev.build_dir, self.budget, self.ready,
                                     stale_after_s=self.config.build_timeout_s + 60.0,
                                     on_start=self.rec.build_started, on_done=lambda t: self.rec.build_finished())
        try:
            for i, job in enumerate(self.jobs):
                if job.candidate is not None and build.needs_build(job.candidate):
                    self.tickets[i] = farm.submit(job)
            share = self.config.workers_per_gpu
            lanes = [
                (g, g if share == 1 else f"{'cpu' if g is None else g}/{k}")
                for g in self.plan.lanes
                for k in range(share)
            ]
            threads = [threading.Thread(target=self.lane, args=lane, name=f"cudal1-lane-{lane[1]}") for lane in lanes]
            for t in threads:
                t.start()
            try:
                for t in threads:
                    t.join()
            except BaseException:  # Ctrl-C / SIGTERM: stop the lanes, kill running workers, keep nothing half-done
                self.stop()
                for t in threads:
                    t.join()
                raise
        finally:
            farm.shutdown()
            self.ev.close()
        if self.failures:
            raise self.failures[0]
        missing = [i for i, r in enumerate(self.results) if r is None]
        try:
            drain.check(len(missing))
        except drain.Drained as exc:  # every started job has its verdict: the stats of what ran hold
            exc.stats = self.rec.finish()
            raise
        if missing:
            raise HarnessError(f"internal error: no result for job(s) {missing}")
        self._record_builds()
        if on_stats is not None:
            on_stats(self.rec.finish())
        return self.results  # type: ignore[return-value]

    def stop(self) -> None:
        """Interrupt the batch: no lane takes another job, the verdicts of jobs still running are
        dropped (their workers and pre-builds are killed), recorded ones stay."""
        from cudal1.harness.parent import sandbox

        with self.ready:
            self.stopping = True
            self.ready.notify_all()
        if self.farm is not None:
            self.farm.stop()
        sandbox.stop_all()

    def take(self, gpu: int | None = None) -> int | None:
        """The pending job that is ready (no build, or its build done) whose task took longest
        so far (``TASK_SECONDS``; the first such in the batch's order), of those that would not
        wait at ``gpu``'s gate now where any would not (:meth:`would_wait`); sleeps until a build
        finishes when none is ready, or, with ``follow``, until a running job's verdict adds
        one; None when nothing is left (or a lane failed, or a drain began, or a drain's deadline
        leaves no pending job time to end before it)."""
        with self.ready:
            while True:
                if self.failures or self.stopping:
                    return None
                if not self.pending:
                    if not self.running or self.follow is None or drain.requested():
                        return None
                    self.ready.wait(timeout=1.0)
                    continue
                fits = (set(self.pending) if not drain.bounding() else  # no drain, no deadline: every job
                        {i for i in self.pending if drain.admits(task_seconds.TASK_SECONDS.expected(self.jobs[i]),
                                                                 task_seconds.TASK_SECONDS.stand_in(self.jobs[i]))})
                if drain.out_of_time(bool(fits)):
                    return None  # a drain, or a deadline nothing left fits before
                ready = [i for i in self.pending if (i not in self.tickets or self.tickets[i].done) and i in fits]
                if ready:
                    longest = {i: task_seconds.TASK_SECONDS.get(self.jobs[i].task.hash) for i in ready}
                    gate = self.gates.get(gpu)
                    counted = gate is not None and gate.capacity_mib  # 0 with one worker per GPU
                    now = {i: not self.would_wait(self.jobs[i], gate) for i in ready} if counted else {}
                    pick = max(ready, key=lambda i: (now.get(i, True), longest[i], -i))
                    self.pending.remove(pick)
                    self.running += 1
                    return pick
                self.ready.wait(timeout=1.0)

    def extend(self, more: list[Job]) -> None:
        """Jobs a verdict made possible join the batch (their builds handed to the farm first)."""
        if not more:
            return
        with self.ready:
            start = len(self.jobs)
            self.jobs.extend(more)
            self.results.extend([None] * len(more))
            self.rec.add_jobs(more)
        for i, job in enumerate(more, start):
            if job.candidate is not None and build.needs_build(job.candidate):
                self.tickets[i] = self.farm.submit(job)
        with self.ready:
            self.pending.extend(range(start, start + len(more)))
            self.ready.notify_all()

    @staticmethod
    def would_wait(job: Job, gate: GpuGate) -> bool:
        """Whether ``job`` would wait at ``gate`` now: for room (:meth:`GpuGate.fits_now`), or,
        judged alone (:meth:`judge`), for the running jobs to end."""
        need, bound = gpu_memory.TASK_MEMORY.need(job.task.hash), gpu_memory.TASK_MEMORY.bound(job.task.hash)
        if runs_alone(gate, need, bound):
            return gate.active > 0
        return not gate.fits_now(need, bound)

    def lane(self, gpu: int | None, key: int | str | None) -> None:
        """One timing lane: a thread judging one job at a time on ``gpu``; ``key`` names it in the
        stats (the GPU, or ``GPU/k`` when ``workers_per_gpu`` lanes share it)."""
        rec = self.rec
        rec.lane_start(key)
        t0 = mark = time.monotonic()
        try:
            while (i := self.take(gpu)) is not None:
                now = time.monotonic()
                rec.lane_wait(key, now - mark)
                mark = now
                try:
                    ticket = self.tickets.get(i)
                    res = self.judge(i, gpu, ticket.result() if ticket is not None else None)
                    if self.stopping:  # its worker was killed by the interrupt: not a verdict
                        break
                    self.results[i] = res
                    if self.on_result is not None:
                        self.on_result(i, res)
                    if self.follow is not None:
                        self.extend(self.follow(i, res))
                finally:
                    with self.ready:
                        self.running -= 1
                        self.ready.notify_all()
                now = time.monotonic()
                task_seconds.TASK_SECONDS.note(self.jobs[i], now - mark)
                gpu_memory.TASK_MEMORY.note(self.jobs[i].task.hash, res.figures.get("gpu_memory_mib"))
                rec.judged(key, i, now - mark, worker_build_s=in_worker_build_s(res))
                mark = now
        except BaseException as exc:  # noqa: BLE001 - re-raised after the join
            self.failures.append(exc)
            with self.ready:
                self.ready.notify_all()
        finally:
            end = time.monotonic()
            rec.lane_wait(key, end - mark)
            rec.lane_end(key, end - t0)

    def judge(self, i: int, gpu: int | None, prebuilt: Any) -> EvalResult:
        """Job ``i``'s verdict on ``gpu``.  With several workers per GPU, a job that ran out of
        memory is judged again with the GPU to itself (:class:`GpuGate`); flag ``rejudged_alone``; so
        is one whose timing was ``contended`` by a process outside the judge (once: if that process
        stays, the second verdict says ``contended`` too), and one whose timed calls on a side were
        mostly blocked (:mod:`.blocked`: their GPU figure holds host time; once).
        Its task is remembered (``TASK_MEMORY``): later jobs of it go straight to the GPU
        alone instead of paying a shared attempt first, or, where its memory was measured and
        fits in the GPU's beside others, enter with that share (:func:`runs_alone`); one that ran
        out of memory within its share runs alone from then on."""
        gate, stopping = self.gates[gpu], lambda: self.stopping
        job = self.jobs[i]
        h = job.task.hash
        shared = self.config.workers_per_gpu > 1
        need = gate.share(gpu_memory.TASK_MEMORY.need(h))  # a capacity only with several workers per GPU
        bound = shared and gpu_memory.TASK_MEMORY.bound(h)
        def alone() -> EvalResult:
            return gate.alone(lambda: self.ev.evaluate_job(job, gpu, prebuilt), stopping)

        if shared and runs_alone(gate, need, bound):
            return alone()
        gate.enter(stopping, need, wait_for_room=bound)
        try:
            res = self.ev.evaluate_job(job, gpu, prebuilt)
        finally:
            gate.leave(need)
        if shared and out_of_memory(res) and not self.stopping:
            gpu_memory.TASK_MEMORY.ran_out(h)
            if need:  # out of memory within its measured share: the share says nothing, alone from now on
                gpu_memory.TASK_MEMORY.note(h, gate.capacity_mib)
            res = alone()
            res.flags.append("rejudged_alone")
        elif (res.figures.get("contention") or {}).get(
            "gpu"
        ) and not self.stopping:  # another process used the GPU: once more, alone
            res = alone()
            res.flags.append("rejudged_alone")
        elif shared and (side := worth_judging_alone(res, h)) and not self.stopping:
            first = {"because": f"the {side}'s timed calls were blocked beside other jobs",
                     "blocked_calls": res.figures.get("blocked_calls"), "speedup": res.speedup}
            res = alone()
            if "reference" in blocked_sides(res):  # its reference blocks by itself: not judged again for it
                gpu_memory.TASK_MEMORY.reference_blocked_alone(h)
            res.flags.append("rejudged_alone")
            res.figures["rejudged_alone"] = first
        return res

    def _record_builds(self) -> None:
        for i, t in self.tickets.items():
            if t.leader is not None:
                self.rec.build(i, "shared")
                continue
            _, cached = t.result()
            queue_s = (t.started_at or t.queued_at) - t.queued_at
            build_s = (t.finished_at or 0.0) - (t.started_at or 0.0) if t.started_at else 0.0
            self.rec.build(i, "cached" if cached else "built", queue_s, build_s, t.lock_wait_s)
