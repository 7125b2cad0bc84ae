"""Where a batch's time went: build queue, builds, judging, and timing lanes left idle.

Contract: :class:`BatchStats` is what :func:`cudal1.harness.parent.batch.run_jobs` hands its
``on_stats`` callback once per batch (both backends).  Times are wall-clock seconds on the driver
(the Ray backend's build and judge times are measured where they ran and sent back).  The totals
add up by construction: per lane ``startup_s + busy_s + idle_s == wall_s`` of that lane, and the
jobs' ``judge_s`` sum to the lanes' ``busy_s``.  ``idle_share`` is the share of lane time spent
waiting for work *after* each lane's first job (the issue's "GPU idle once the first builds
finish"); the wait before a lane's first job is ``startup_s``.  A lane is busy, but its GPU is
not, while a worker imports its candidate or builds an extension the pre-build did not reach:
``lane_build_s`` sums those phases (``EvalResult.phase_s`` ``import`` + ``build``) and
``gpu_idle_share`` counts them as idle.  Where the workers' phase timelines are known (the local
backend), ``gpu_idle_share`` is measured per GPU instead: the share of each GPU's span (its
first job's start to its last job's end) in which no worker on it was in a GPU phase
(:data:`GPU_PHASES`; worker start-up, imports, builds and waits for the GPU lease are idle), so
it stays true when several workers share a GPU (``EvalConfig.workers_per_gpu``).  Not covered: the
rest of what happens inside a GPU worker (its other phases are in each ``EvalResult.phase_s``), and
time a lane spends on the CPU side of a job (static guard, assembly), which counts as busy.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# The phases that hold the GPU's lease; ``compile`` (torch.compile compiling inside construct or
# correctness, cudal1.harness.child.compiling) keeps the lease of the phase it interrupts;
# ``compile_cpu`` (the same off the lease, EvalConfig.compile_off_lease) holds none.
GPU_PHASES = frozenset({"reference", "construct", "compile", "correctness", "timing", "verify", "verify_timing"})


def union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


@dataclass
class JobTimes:
    index: int  # the job's position in the batch
    label: str
    lane: int | str | None = None  # the GPU (or Ray actor) that judged it
    build: str = (
        "none"  # none | built | shared (an identical source built by another job) | cached (found in the cache)
    )
    build_queue_s: float = 0.0  # submitted -> its build process started
    build_s: float = 0.0  # build process start -> end (lock waits included)
    lock_wait_s: float = 0.0  # waiting on another process's build of the same source (flock)
    judge_s: float = 0.0  # the lane's time on this job (worker start to verdict, assembly included)
    worker_build_s: float = 0.0  # of judge_s: the worker's import + in-worker build phases (GPU unused)
    attempts: int = 1  # > 1 when a Ray actor died and the job was run again


@dataclass
class LaneTimes:
    lane: int | str | None
    jobs: int = 0
    wall_s: float = 0.0  # lane start -> lane end
    startup_s: float = 0.0  # waiting before its first job (the first builds)
    busy_s: float = 0.0  # judging
    idle_s: float = 0.0  # waiting for ready work after its first job


@dataclass
class BatchStats:
    backend: str = "local"
    jobs: int = 0
    wall_s: float = 0.0
    build_workers: int = 0  # concurrent build processes allowed
    max_jobs: int = 0  # each build's own compiler parallelism (MAX_JOBS)
    builds: int = 0  # build processes run
    builds_shared: int = 0  # jobs whose identical source another job of the batch built
    builds_cached: int = 0  # builds that found their library already in the cache
    build_queue_s: float = 0.0
    build_s: float = 0.0
    lock_wait_s: float = 0.0
    max_concurrent_builds: int = 0
    judge_s: float = 0.0
    lane_startup_s: float = 0.0
    lane_idle_s: float = 0.0
    lane_busy_s: float = 0.0
    lane_build_s: float = 0.0  # of lane_busy_s: candidate imports and builds inside GPU workers
    lease_wait_s: float = 0.0  # of lane_busy_s: workers waiting for their GPU's lease (workers_per_gpu > 1)
    lane_span_s: float = 0.0  # lanes x the batch's wall: the lanes' time from its start to its end
    gpu_span_s: float = 0.0  # per GPU, first job start -> last job end, summed (local backend)
    gpu_busy_s: float = 0.0  # of gpu_span_s: some worker on the GPU in a GPU phase
    retries: int = 0  # jobs run again after their actor died (Ray)
    batches: int = 1
    lanes: list[LaneTimes] = field(default_factory=list)
    per_job: list[JobTimes] = field(default_factory=list)

    @property
    def idle_share(self) -> float | None:
        """Lane time idle after each lane's first job, over that lane time."""
        after_first = self.lane_busy_s + self.lane_idle_s
        return self.lane_idle_s / after_first if after_first > 0 else None

    @property
    def gpu_idle_share(self) -> float | None:
        """Share of each GPU's span with no worker in a GPU phase (when timelines are known),
        else like :attr:`idle_share` with the lanes' in-worker imports and builds counted as idle."""
        if self.gpu_span_s > 0:
            return max(0.0, 1.0 - self.gpu_busy_s / self.gpu_span_s)
        after_first = self.lane_busy_s + self.lane_idle_s
        return (self.lane_idle_s + self.lane_build_s) / after_first if after_first > 0 else None

    @property
    def lanes_unused_share(self) -> float | None:
        """Share of the lanes' time, from the batch's start to its end, in which they judged
        nothing: waits for a first ready job, idle waits, and each lane's tail after its last job
        while others still ran (what a batch boundary costs where jobs depend on the batch before)."""
        if self.lane_span_s <= 0:
            return None
        return max(0.0, 1.0 - self.lane_busy_s / self.lane_span_s)

    @property
    def mean_concurrent_builds(self) -> float | None:
        return self.build_s / self.wall_s if self.wall_s > 0 and self.builds else None

    def merge(self, other: "BatchStats") -> "BatchStats":
        """Totals of two batches (lanes and per-job lists are concatenated)."""
        out = BatchStats(backend=self.backend if self.backend == other.backend else f"{self.backend}+{other.backend}")
        for name in (
            "jobs", "wall_s", "builds", "builds_shared", "builds_cached", "build_queue_s", "build_s",
            "lock_wait_s", "judge_s", "lane_startup_s", "lane_idle_s", "lane_busy_s", "lane_build_s",
            "retries", "batches", "lease_wait_s", "lane_span_s", "gpu_span_s", "gpu_busy_s",
        ):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        for name in ("build_workers", "max_jobs", "max_concurrent_builds"):
            setattr(out, name, max(getattr(self, name), getattr(other, name)))
        out.lanes = self.lanes + other.lanes
        out.per_job = self.per_job + other.per_job
        return out

    def to_dict(self, detail: bool = False) -> dict[str, Any]:
        """Totals (and, with ``detail``, per lane and per job) as JSON-ready values."""
        data = {k: v for k, v in asdict(self).items() if k not in ("lanes", "per_job")}
        data = {k: round(v, 3) if isinstance(v, float) else v for k, v in data.items()}
        share, mean, gpu_share = self.idle_share, self.mean_concurrent_builds, self.gpu_idle_share
        data["idle_share"] = None if share is None else round(share, 4)
        data["gpu_idle_share"] = None if gpu_share is None else round(gpu_share, 4)
        unused = self.lanes_unused_share
        data["lanes_unused_share"] = None if unused is None else round(unused, 4)
        data["mean_concurrent_builds"] = None if mean is None else round(mean, 3)
        if detail:
            data["lanes"] = [asdict(x) for x in self.lanes]
            data["per_job"] = [asdict(x) for x in self.per_job]
        return data


def total(stats: list[BatchStats]) -> BatchStats | None:
    """Several batches' stats merged into one (None for none)."""
    out = None
    for s in stats:
        out = s if out is None else out.merge(s)
    return out


def in_worker_build_s(result: Any) -> float:
    """Seconds a GPU worker spent importing its candidate and building extensions itself (an
    ``EvalResult``'s ``import`` + ``build`` phases): lane time in which its GPU did nothing."""
    return result.phase_s.get("import", 0.0) + result.phase_s.get("build", 0.0)


class StatsRecorder:
    """Thread-safe collector used by the schedulers while a batch runs."""

    def __init__(self, backend: str, jobs: list[Any], build_workers: int, max_jobs: int) -> None:
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.stats = BatchStats(backend=backend, jobs=len(jobs), build_workers=build_workers, max_jobs=max_jobs)
        self.jobs = [JobTimes(i, job.label) for i, job in enumerate(jobs)]
        self._lanes: dict[Any, LaneTimes] = {}
        self._running_builds = 0
        self._gpu_jobs: dict[Any, list[tuple[float, float]]] = {}  # gpu -> (worker start, verdict) per job
        self._gpu_busy: dict[Any, list[tuple[float, float]]] = {}  # gpu -> intervals of GPU phases
        self._lease_wait = 0.0

    def add_jobs(self, jobs: list[Any]) -> None:
        """Jobs that joined the batch after it started (numbered after the others)."""
        with self.lock:
            start = len(self.jobs)
            self.jobs.extend(JobTimes(start + k, job.label) for k, job in enumerate(jobs))
            self.stats.jobs = len(self.jobs)

    def gpu_phases(self, gpu: Any, timeline: list[tuple[str, float, float]]) -> None:
        """One worker's phases ``(name, start, end)`` on ``gpu`` (``JobOutcome.timeline``: the
        workers' ``time.time()``, one clock for all workers of this machine)."""
        if not timeline:
            return
        with self.lock:
            self._gpu_jobs.setdefault(gpu, []).append((timeline[0][1], timeline[-1][2]))
            self._gpu_busy.setdefault(gpu, []).extend((a, b) for name, a, b in timeline if name in GPU_PHASES)
            self._lease_wait += sum(b - a for name, a, b in timeline if name == "lane")

    # builds
    def build_started(self) -> None:
        with self.lock:
            self._running_builds += 1
            self.stats.max_concurrent_builds = max(self.stats.max_concurrent_builds, self._running_builds)

    def build_finished(self) -> None:
        with self.lock:
            self._running_builds -= 1

    def build(
        self, index: int, kind: str, queue_s: float = 0.0, build_s: float = 0.0, lock_wait_s: float = 0.0
    ) -> None:
        with self.lock:
            j = self.jobs[index]
            j.build, j.build_queue_s, j.build_s, j.lock_wait_s = kind, queue_s, build_s, lock_wait_s

    # lanes
    def lane_start(self, lane: Any) -> None:
        with self.lock:
            self._lanes[lane] = LaneTimes(lane)

    def lane_wait(self, lane: Any, seconds: float) -> None:
        with self.lock:
            lt = self._lanes[lane]
            if lt.jobs:
                lt.idle_s += seconds
            else:
                lt.startup_s += seconds

    def judged(self, lane: Any, index: int, seconds: float, attempts: int = 1, worker_build_s: float = 0.0) -> None:
        """``worker_build_s``: of ``seconds``, the worker's import and in-worker build phases."""
        with self.lock:
            lt = self._lanes[lane]
            lt.jobs += 1
            lt.busy_s += seconds
            j = self.jobs[index]
            j.lane, j.judge_s, j.attempts = lane, seconds, attempts
            j.worker_build_s = min(max(0.0, worker_build_s), seconds)

    def lane_end(self, lane: Any, wall_s: float) -> None:
        """``wall_s``: the lane's own clock, of which its waits and jobs are contiguous segments."""
        with self.lock:
            self._lanes[lane].wall_s = wall_s

    def finish(self, retries: int = 0) -> BatchStats:
        s = self.stats
        s.wall_s = time.monotonic() - self.t0
        s.retries = retries
        s.lanes = list(self._lanes.values())
        s.per_job = self.jobs
        s.builds = sum(j.build in ("built", "cached") for j in self.jobs)
        s.builds_shared = sum(j.build == "shared" for j in self.jobs)
        s.builds_cached = sum(j.build == "cached" for j in self.jobs)
        s.build_queue_s = sum(j.build_queue_s for j in self.jobs)
        s.build_s = sum(j.build_s for j in self.jobs)
        s.lock_wait_s = sum(j.lock_wait_s for j in self.jobs)
        s.judge_s = sum(j.judge_s for j in self.jobs)
        s.lane_startup_s = sum(x.startup_s for x in s.lanes)
        s.lane_idle_s = sum(x.idle_s for x in s.lanes)
        s.lane_busy_s = sum(x.busy_s for x in s.lanes)
        s.lane_span_s = len(s.lanes) * s.wall_s
        s.lane_build_s = sum(j.worker_build_s for j in self.jobs)
        s.lease_wait_s = self._lease_wait
        s.gpu_span_s = sum(max(b for _, b in jobs) - min(a for a, _ in jobs) for jobs in self._gpu_jobs.values())
        s.gpu_busy_s = sum(union_s(busy) for busy in self._gpu_busy.values())
        return s
