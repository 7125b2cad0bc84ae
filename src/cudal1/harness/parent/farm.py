"""The local build farm: pre-builds of ``load_inline`` candidates in CPU children, sized to the
machine, one build per distinct source, safe next to other processes using the same cache.

Contract:

- :class:`BuildBudget` sizes the farm: concurrent builds x each build's own compiler parallelism
  (``MAX_JOBS``) add up to the cores left once every timing lane has one, and to the memory a
  compiler process needs (:data:`GIB_PER_COMPILER`); never bounded by the number of lanes.
- :class:`BuildFarm` starts every build as soon as it is submitted (up to the budget; the rest
  wait in submission order).  Jobs whose candidate source (hence build directory) is identical
  share one build: the second waits for the first and gets its outcome, marked as cached.
  Each build holds an exclusive ``flock`` on its build directory (:func:`build.locked`), so two
  processes (two runs, two judges) sharing the cache never build the same source at once: the
  second waits, then finds the library.  Stale torch batons left by a killed build are cleared
  under that lock.
- Completion is signalled on the ``ready`` condition the caller passes in, so timing lanes can
  sleep until *some* job is ready instead of waiting on one particular build.

Not covered: extensions first built in ``forward`` (builds in ``ModelNew.__init__`` are reached
by :func:`build.prebuild_source`), Triton kernels; both build in the GPU worker.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cudal1.harness import build

GIB_PER_COMPILER = 2.0  # resident memory of one nvcc/cc1plus process compiling against torch's headers
UNITS_PER_BUILD = 2  # a load_inline build compiles main.cpp and cuda.cu: ninja cannot use more than 2 jobs


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class BuildBudget:
    workers: int  # concurrent build processes
    max_jobs: int  # MAX_JOBS of each (ninja's parallel compiler processes)
    cores: int
    memory_gib: float | None

    @classmethod
    def detect(
        cls, requested: int, lanes: int, *, cores: int | None = None, memory_gib: float | None = -1.0
    ) -> "BuildBudget":
        """``requested`` > 0 fixes the number of builds (``EvalConfig.build_workers``); 0 sizes it.
        ``lanes`` timing lanes each keep one core.  ``memory_gib`` -1: read ``/proc/meminfo``."""
        cores = cores or cpu_cores()
        memory = available_memory_gib() if memory_gib == -1.0 else memory_gib
        build_cores = max(1, cores - lanes)
        compilers = build_cores if memory is None else max(1, min(build_cores, int(memory // GIB_PER_COMPILER)))
        workers = requested if requested > 0 else max(1, compilers // UNITS_PER_BUILD)
        max_jobs = max(1, compilers // workers)
        return cls(workers, max_jobs, cores, memory)


@dataclass
class Ticket:
    """One job's pre-build.  ``leader`` is set for a job that shares an identical source's build."""

    key: Path
    queued_at: float
    leader: "Ticket | None" = None
    started_at: float | None = None
    finished_at: float | None = None
    lock_wait_s: float = 0.0
    future: Future = field(default_factory=Future)

    @property
    def done(self) -> bool:
        return (self.leader or self).future.done()

    @property
    def started(self) -> bool:
        return (self.leader or self).started_at is not None

    def result(self) -> tuple[Any, bool]:
        """(outcome, was_cached); a shared build's outcome with its costs zeroed (paid by the leader)."""
        if self.leader is None:
            return self.future.result()
        return shared(self.leader.future.result()[0]), True


def shared(outcome: Any) -> Any:
    """A pre-build outcome as seen by a job that did not pay for it: same verdict, no build time."""
    built = outcome.built
    if built is not None:
        built = dataclasses.replace(built, build_s=0.0)
    return dataclasses.replace(outcome, wall_s=0.0, built=built)


class BuildFarm:
    """Pre-builds on ``budget.workers`` threads, each running ``prebuild(job) -> (outcome, cached)``
    (a sandboxed CPU child) under the build directory's lock.  ``on_done(ticket)`` runs after
    every build (before ``ready`` is notified)."""

    def __init__(self, prebuild: Callable[[Any], tuple[Any, bool]], key: Callable[[Any], Path], budget: BuildBudget,
                 ready: threading.Condition, *, stale_after_s: float = 3600.0,
                 on_start: Callable[[], None] | None = None, on_done: Callable[[Ticket], None] | None = None) -> None:
        self.prebuild, self.key, self.budget, self.ready = prebuild, key, budget, ready
        self.stale_after_s = stale_after_s
        self.on_start, self.on_done = on_start, on_done
        self.pool = ThreadPoolExecutor(max_workers=budget.workers, thread_name_prefix="cudal1-build")
        self.by_key: dict[Path, Ticket] = {}
        self.lock = threading.Lock()
        self.stopped = False  # an interrupted batch: builds not yet started never start

    def stop(self) -> None:
        """Start no further build (running ones are the caller's to kill: ``sandbox.stop_all``)."""
        self.stopped = True

    def submit(self, job: Any) -> Ticket:
        key = self.key(job)
        with self.lock:
            leader = self.by_key.get(key)
            if leader is not None:
                return Ticket(key, time.monotonic(), leader=leader)
            ticket = self.by_key[key] = Ticket(key, time.monotonic())
        self.pool.submit(self._run, ticket, job)
        return ticket

    def _run(self, ticket: Ticket, job: Any) -> None:
        ticket.started_at = time.monotonic()
        if self.on_start is not None:
            self.on_start()
        try:
            if self.stopped:
                raise InterruptedError("the batch was interrupted before this build started")
            with build.locked(ticket.key) as waited:
                ticket.lock_wait_s = waited
                build.clear_stale_batons(ticket.key, older_than_s=self.stale_after_s)
                began = time.time()
                outcome, cached = self.prebuild(job)
                if getattr(outcome, "timed_out", False):  # killed mid-build: its baton would block every later build
                    build.clear_stale_batons(ticket.key, since=began)
            ticket.future.set_result((outcome, cached))
        except BaseException as exc:  # noqa: BLE001 - surfaces in the lane that takes the job
            ticket.future.set_exception(exc)
        finally:
            ticket.finished_at = time.monotonic()
            if self.on_done is not None:
                self.on_done(ticket)
            with self.ready:
                self.ready.notify_all()

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
