"""A batch on this machine: every build handed to the build farm at once, one thread per timing
lane (or several sharing a GPU), verdicts in job order.

Contract: :func:`run_jobs` is the harness's batch entry (``plan.backend == "ray"`` hands the same
jobs to :mod:`cudal1.harness.parent.ray_backend`).  A lane takes a *ready* job (no build, or its
build finished) and sleeps until a build finishes when none is; it never commits to a build that
has not started.  With several workers per GPU, a job that ran out of memory beside its
neighbours is judged again with the GPU to itself (:class:`GpuGate`, flag ``rejudged_alone``),
and later jobs of its task in this process are judged alone at once (:data:`MEMORY_BOUND`).
Among ready jobs, a lane takes the one whose task took longest so far in this process
(:data:`TASK_SECONDS`), so a batch's long jobs do not end it with the other lanes idle.
A drain (:mod:`cudal1.harness.parent.drain`) lets running jobs finish, starts no other, and raises
``Drained`` for those it never started; under a drain's deadline a lane starts only jobs expected
to end before it (:meth:`TaskSeconds.expected`), and once none is left the drain begins.
``on_result(index, result)`` is called from a lane thread as each verdict arrives, ``on_stats``
once after the batch (:class:`~cudal1.harness.parent.batchstats.BatchStats`).  An interrupt stops every
lane and kills running workers; their jobs leave no verdict.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable

from cudal1.config import EvalConfig
from cudal1.harness import build
from cudal1.harness.parent import drain
from cudal1.harness.parent.batchstats import BatchStats, StatsRecorder, in_worker_build_s
from cudal1.harness.parent.evaluator import Evaluator
from cudal1.harness.parent.plan import BACKENDS, DevicePlan, HarnessError, Job
from cudal1.types import EvalResult, Status


def run_jobs(
    jobs: list[Job],
    config: EvalConfig,
    *,
    plan: DevicePlan | None = None,
    on_result: Callable[[int, EvalResult], None] | None = None,
    on_stats: Callable[[BatchStats], None] | None = None,
) -> list[EvalResult]:
    """Evaluate ``jobs``: parallel pre-builds, one timing lane per GPU.  Order is preserved.
    ``on_result(index, result)`` is called from a lane thread as each verdict arrives;
    ``on_stats(stats)`` once, after the batch."""
    plan = plan or DevicePlan.detect(config.device)
    if plan.backend == "ray":
        from cudal1.harness.parent.ray_backend import run_jobs_ray

        return run_jobs_ray(jobs, config, plan=plan, on_result=on_result, on_stats=on_stats)
    if plan.backend != "local":
        raise HarnessError(f"unknown backend {plan.backend!r}; known: {', '.join(BACKENDS)}")
    return _LocalBatch(jobs, config, plan, on_result).run(on_stats)


def out_of_memory(result: EvalResult) -> bool:
    """The verdict is a failure to get memory (the candidate's or the reference's)."""
    return result.status is Status.RUNTIME_ERROR and "oom" in result.flags


class GpuGate:
    """The jobs running on one GPU, and a way to run one job with the GPU to itself.

    Workers sharing a GPU (``workers_per_gpu`` > 1) share its memory too, so a job can run out of
    memory only because of its neighbours.  Such a verdict is not the job's: :meth:`alone` lets
    the running jobs finish, holds new ones back, and runs the job again by itself; the verdict of
    that run stands."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active = 0  # jobs running on the GPU
        self.solo = 0  # jobs waiting to run alone, or running alone
        self.held_back = 0  # jobs waiting to enter because one waits to run alone

    def enter(self, stopping: Callable[[], bool]) -> None:
        with self.cond:
            while self.solo and not stopping():
                self.held_back += 1
                self.cond.wait(timeout=1.0)
                self.held_back -= 1
            self.active += 1

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def alone(self, run: Callable[[], EvalResult], stopping: Callable[[], bool]) -> EvalResult:
        """``run()`` once no other job runs on this GPU (the caller has left the gate)."""
        with self.cond:
            self.solo += 1
            while self.active and not stopping():
                self.cond.wait(timeout=1.0)
            self.active += 1
        try:
            return run()
        finally:
            with self.cond:
                self.active -= 1
                self.solo -= 1
                self.cond.notify_all()


class MemoryBoundTasks:
    """Tasks (by hash) that ran out of GPU memory beside other jobs in this process: a task's
    memory is mostly its inputs, outputs and answers, so its later jobs (the next candidates, the
    next round of a search) would run out the same way.  Thread-safe; lives as long as the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hashes: set[str] = set()

    def add(self, task_hash: str) -> None:
        with self._lock:
            self._hashes.add(task_hash)

    def has(self, task_hash: str) -> bool:
        with self._lock:
            return task_hash in self._hashes


MEMORY_BOUND = MemoryBoundTasks()


class TaskSeconds:
    """The longest time a lane spent on one job of each task judged in this process, and on one
    job of each *kind* (a candidate, or a baseline mode) of each task and of any task.  A batch
    starts the ready job whose task took longest first (longest first: a level-3 model's job
    started last keeps its GPU busy after the other lanes ran dry), tasks not judged yet before
    them, in the batch's order; the order of results is the batch's either way.  A drain's
    deadline sizes a job by its task's own jobs of its kind (:meth:`expected`; a max-autotune
    baseline is not sized by its task's search verdicts), else by :meth:`stand_in`.
    Thread-safe; lives as long as the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[Any, float] = {}  # task hash, (task hash, kind) and (None, kind) -> longest
        self._longest: float | None = None  # of any job so far

    @staticmethod
    def kind(job: Job) -> str:
        return job.baseline_mode or "candidate"

    def note(self, job: Job, seconds: float) -> None:
        kind = self.kind(job)
        with self._lock:
            for key in (job.task.hash, (job.task.hash, kind), (None, kind)):
                self._seconds[key] = max(seconds, self._seconds.get(key, 0.0))
            self._longest = max(seconds, self._longest or 0.0)

    def get(self, task_hash: str) -> float:
        """Seconds of the task's longest job so far (infinite when none was judged)."""
        with self._lock:
            return self._seconds.get(task_hash, math.inf)

    def expected(self, job: Job) -> float:
        """Seconds of the longest job of this kind of this task so far (infinite when none)."""
        with self._lock:
            return self._seconds.get((job.task.hash, self.kind(job)), math.inf)

    def stand_in(self, job: Job) -> float:
        """For a job with no :meth:`expected` time: the longest job of its kind of any task so
        far, else the longest job of any kind (infinite when none was judged)."""
        with self._lock:
            return self._seconds.get((None, self.kind(job)), math.inf if self._longest is None else self._longest)


TASK_SECONDS = TaskSeconds()


class _LocalBatch:
    """One batch on this machine: a build farm feeding one thread per timing lane."""

    def __init__(self, jobs: list[Job], config: EvalConfig, plan: DevicePlan,
                 on_result: Callable[[int, EvalResult], None] | None) -> None:
        from cudal1.harness.parent.farm import BuildBudget

        self.jobs, self.config, self.plan, self.on_result = jobs, config, plan, on_result
        self.budget = BuildBudget.detect(config.build_workers, len(plan.lanes) * config.workers_per_gpu)
        self.ev = Evaluator(config, plan, max_jobs=self.budget.max_jobs)
        self.rec = StatsRecorder("local", jobs, self.budget.workers, self.budget.max_jobs)
        self.ev.on_timeline = self.rec.gpu_phases
        self.results: list[EvalResult | None] = [None] * len(jobs)
        self.pending = list(range(len(jobs)))
        self.ready = threading.Condition()
        self.failures: list[BaseException] = []
        self.stopping = False  # set when the batch is interrupted: lanes take nothing more, drop what runs
        self.farm: Any = None
        self.tickets: dict[int, Any] = {}  # job -> farm.Ticket
        self.gates = {gpu: GpuGate() for gpu in plan.lanes}  # jobs on each GPU (run alone after an OOM)

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
        drain.check(len(missing))
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

    def take(self) -> int | None:
        """The pending job that is ready (no build, or its build done) whose task took longest
        so far (:data:`TASK_SECONDS`; the first such in the batch's order); sleeps until a build
        finishes when none is; None when nothing is left (or a lane failed, or a drain began, or
        a drain's deadline leaves no pending job time to end before it)."""
        with self.ready:
            while True:
                if self.failures or self.stopping or not self.pending:
                    return None
                fits = (set(self.pending) if not drain.bounding() else  # no drain, no deadline: every job
                        {i for i in self.pending if drain.admits(TASK_SECONDS.expected(self.jobs[i]),
                                                                 TASK_SECONDS.stand_in(self.jobs[i]))})
                if drain.out_of_time(bool(fits)):
                    return None  # a drain, or a deadline nothing left fits before
                ready = [i for i in self.pending if (i not in self.tickets or self.tickets[i].done) and i in fits]
                if ready:
                    longest = {i: TASK_SECONDS.get(self.jobs[i].task.hash) for i in ready}
                    pick = max(ready, key=lambda i: (longest[i], -i))
                    self.pending.remove(pick)
                    return pick
                self.ready.wait(timeout=1.0)

    def lane(self, gpu: int | None, key: int | str | None) -> None:
        """One timing lane: a thread judging one job at a time on ``gpu``; ``key`` names it in the
        stats (the GPU, or ``GPU/k`` when ``workers_per_gpu`` lanes share it)."""
        rec = self.rec
        rec.lane_start(key)
        t0 = mark = time.monotonic()
        try:
            while (i := self.take()) is not None:
                now = time.monotonic()
                rec.lane_wait(key, now - mark)
                mark = now
                ticket = self.tickets.get(i)
                res = self.judge(i, gpu, ticket.result() if ticket is not None else None)
                if self.stopping:  # its worker was killed by the interrupt: not a verdict
                    break
                self.results[i] = res
                if self.on_result is not None:
                    self.on_result(i, res)
                now = time.monotonic()
                TASK_SECONDS.note(self.jobs[i], now - mark)
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
        stays, the second verdict says ``contended`` too).
        Its task is remembered (:data:`MEMORY_BOUND`): later jobs of it go straight to the GPU
        alone instead of paying a shared attempt first."""
        gate, stopping = self.gates[gpu], lambda: self.stopping
        job = self.jobs[i]
        shared = self.config.workers_per_gpu > 1
        if shared and MEMORY_BOUND.has(job.task.hash):
            return gate.alone(lambda: self.ev.evaluate_job(job, gpu, prebuilt), stopping)
        gate.enter(stopping)
        try:
            res = self.ev.evaluate_job(job, gpu, prebuilt)
        finally:
            gate.leave()
        if shared and out_of_memory(res) and not self.stopping:
            MEMORY_BOUND.add(job.task.hash)
            res = gate.alone(lambda: self.ev.evaluate_job(job, gpu, prebuilt), stopping)
            res.flags.append("rejudged_alone")
        elif (res.figures.get("contention") or {}).get(
            "gpu"
        ) and not self.stopping:  # another process used the GPU: once more, alone
            res = gate.alone(lambda: self.ev.evaluate_job(job, gpu, prebuilt), stopping)
            res.flags.append("rejudged_alone")
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
