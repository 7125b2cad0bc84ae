"""The Ray backend of :func:`cudal1.harness.parent.batch.run_jobs`: the same jobs, judged by
long-lived timing actors (one per GPU of the cluster; one on a CPU-only cluster) fed by build
tasks on the cluster's CPUs.

Contract:

- Each actor holds an :class:`~cudal1.harness.parent.evaluator.Evaluator` and judges exactly as the
  local backend does: a fresh sandboxed worker process per candidate (``sandbox.run_job`` with a
  ``WorkerSpec``), the same static guards, assembly and flags; results are the same
  ``EvalResult`` type and shape.  The actor never sees a store; results come back to the driver,
  which alone calls ``on_result`` (and so alone writes the run store).
- Pre-builds are Ray CPU tasks requesting ``MAX_JOBS`` CPUs each, so Ray's accounting keeps
  builds x compiler jobs within each node's cores.  Each runs under the build directory's file
  lock of *its* node (the build cache is per node); a job is preferably judged by an actor on the
  node that built it (elsewhere, the worker builds again under its deadline).  Identical sources
  are built once per batch.
- A lane (actor) is given only jobs that are ready (no build, or build done), at most
  ``INFLIGHT_PER_ACTOR`` at a time (back-pressure: the driver holds the rest); build tasks in
  flight are bounded too.
- When an actor (or its node) dies, its in-flight jobs run again on a fresh actor, at most
  ``MAX_ATTEMPTS`` times in all; after that the job gets a ``runtime_error`` naming the lost
  actor.  Build tasks lost with their node are retried by Ray; one that still fails leaves its job
  to be built by the judging worker.
- A drain (:mod:`cudal1.harness.parent.drain`) dispatches and builds nothing more; the jobs out
  finish, and the batch raises ``Drained`` for the rest.
- Without an address a local cluster is started, bound to the loopback interface, with no
  dashboard.  Ray is optional (the ``distributed`` extra); this module imports it only inside
  functions, and a missing Ray is one line naming the extra.

Not covered: placement across heterogeneous GPUs (builds target every capability in the
cluster), moving build caches between nodes, a cluster that loses GPUs for good (a replacement
actor then waits for resources that never come back), and preemption of a job that hangs an
actor beyond the sandbox's own deadlines.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import cudal1
from cudal1.config import EvalConfig
from cudal1.extras import require
from cudal1.harness.parent import drain
from cudal1.harness.parent.batchstats import BatchStats, StatsRecorder, in_worker_build_s, total
from cudal1.harness.parent.evaluator import Evaluator
from cudal1.harness.parent.plan import DevicePlan, HarnessError, Job
from cudal1.types import EvalResult, Status, content_hash

INFLIGHT_PER_ACTOR = 2  # one running, one queued in the actor's mailbox: no round-trip gap between jobs
MAX_ATTEMPTS = 3  # a job whose actor died is run at most this many times in all

_pools: dict[str | None, "ActorPool"] = {}
_pools_lock = threading.Lock()


def _ray() -> Any:
    require("the ray backend", "ray", extra="distributed")
    import ray

    return ray


def connect(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None) -> Any:
    """Attach to the cluster at ``address``, or start a local one (loopback only, no dashboard).
    An already initialised Ray session is reused.  Returns the ``ray`` module."""
    if address is None:
        # Loopback only: Ray binds its servers to the node address, which is then 127.0.0.1.
        # The constant is read at import and by every process Ray starts (they inherit the env).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = _ray()
    if ray.is_initialized():
        return ray
    src = str(Path(cudal1.__file__).resolve().parents[1])  # where ``cudal1`` is importable from
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    runtime_env = {"env_vars": {"PYTHONPATH": path}}
    if address is None:
        try:
            from ray._private import ray_constants

            if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0":
                ray_constants.ENABLE_RAY_CLUSTER = False  # ray imported earlier: the env came too late
        except (ImportError, AttributeError):
            pass
        from cudal1.harness.parent.farm import cpu_cores

        ray.init(address="local", include_dashboard=False, num_cpus=num_cpus or cpu_cores(), num_gpus=num_gpus,
                 log_to_driver=False, namespace="cudal1", runtime_env=runtime_env)
    else:
        ray.init(address=address, log_to_driver=False, namespace="cudal1", runtime_env=runtime_env)
    return ray


# ---- the actor and the build task (run on cluster nodes) ------------------------------------------

class TimingActor:
    """One timing lane: judges jobs on the GPU Ray gave it (or the CPU), one at a time."""

    def __init__(self, device: str) -> None:
        self.plan = DevicePlan.detect(device)  # Ray set CUDA_VISIBLE_DEVICES to this actor's GPU
        self.evaluators: dict[tuple[str, int, str], Evaluator] = {}

    def describe(self) -> dict[str, Any]:
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "device": self.plan.device,
                "lane": self.plan.lanes[0], "arch_list": self.plan.arch_list, "driver": self.plan.driver}

    def evaluate(self, config: EvalConfig, seed: int, arch_list: str, max_jobs: int, job: Job,
                 prebuilt: Any) -> tuple[EvalResult, float]:
        if self.plan.device == "cpu":  # other actors may time on this node's CPUs: bound threads would collide
            config = config.replace(cpu_binding=False)
        key = (config.hash() + repr(config), seed, arch_list)
        ev = self.evaluators.get(key)
        if ev is None:
            plan = DevicePlan(self.plan.device, self.plan.lanes, arch_list, self.plan.driver)
            ev = self.evaluators[key] = Evaluator(config, plan, max_jobs=max_jobs, input_seed=seed)
        t0 = time.monotonic()
        result = ev.evaluate_job(job, self.plan.lanes[0], prebuilt)
        return result, time.monotonic() - t0

    def close(self, seed: int) -> None:
        for key in [k for k in self.evaluators if k[1] == seed]:
            self.evaluators.pop(key).close()


def prebuild_task(config: EvalConfig, seed: int, arch_list: str, max_jobs: int, job: Job) -> dict[str, Any]:
    """A pre-build on whichever node Ray chose, under that node's build-directory lock."""
    import ray

    from cudal1.harness import build

    ev = Evaluator(config, DevicePlan("cpu", (None,), arch_list), max_jobs=max_jobs, input_seed=seed)
    bdir = ev.build_dir(job)
    t0 = time.monotonic()
    with build.locked(bdir) as waited:
        build.clear_stale_batons(bdir, older_than_s=config.build_timeout_s + 60.0)
        began = time.time()
        outcome, cached = ev.prebuild(job)
        if outcome.timed_out:
            build.clear_stale_batons(bdir, since=began)
    return {"outcome": outcome, "cached": cached, "node": ray.get_runtime_context().get_node_id(),
            "build_s": time.monotonic() - t0, "lock_wait_s": waited}


# ---- the pool of actors (driver side, long-lived) --------------------------------------------------

@dataclass
class Slot:
    """One lane: the actor currently serving it, and what it holds."""

    index: int
    handle: Any = None
    node: str = ""
    pid: int = 0
    inflight: list[Any] = field(default_factory=list)  # refs of evaluate calls


class ActorPool:
    """Long-lived timing actors of one (address, device), kept across batches of this process."""

    def __init__(self, address: str | None, device: str) -> None:
        ray = self.ray = connect(address, num_gpus=None)
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if device == "cuda" and gpus == 0:
            raise HarnessError("--device cuda: the Ray cluster has no GPU")
        self.device = "cuda" if gpus and device in ("auto", "cuda") else "cpu"
        self.actor_cls = ray.remote(TimingActor).options(num_gpus=1 if self.device == "cuda" else 0, num_cpus=1,
                                                         max_restarts=0, max_task_retries=0)
        self.build_fn = ray.remote(prebuild_task)
        self.slots = [Slot(i) for i in range(gpus if self.device == "cuda" else 1)]
        for slot in self.slots:
            self.replace(slot)
        info = [self.describe(s) for s in self.slots]
        self.arch_list = ";".join(sorted({c for i in info for c in i["arch_list"].split(";") if c}))
        self.driver = next((i["driver"] for i in info if i["driver"]), None)

    def replace(self, slot: Slot) -> None:
        if slot.handle is not None:
            try:
                self.ray.kill(slot.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - it is already gone
                pass
        slot.handle = self.actor_cls.remote(self.device)
        slot.inflight = []
        slot.node, slot.pid = "", 0

    def describe(self, slot: Slot) -> dict[str, Any]:
        info = self.ray.get(slot.handle.describe.remote())
        slot.node, slot.pid = info["node"], info["pid"]
        return info

    def plan(self, address: str | None) -> DevicePlan:
        lanes = tuple(range(len(self.slots))) if self.device == "cuda" else (None,)
        return DevicePlan(self.device, lanes, self.arch_list, self.driver, backend="ray", ray_address=address)

    def cpus(self) -> int:
        return int(self.ray.cluster_resources().get("CPU", 1))


def pool(address: str | None, device: str) -> ActorPool:
    """The process's actor pool for ``address`` (created on first use: actors start then)."""
    with _pools_lock:
        existing = _pools.get(address)
        if existing is None:
            existing = _pools[address] = ActorPool(address, device)
        elif device != "auto" and device != existing.device:
            raise HarnessError(f"the Ray pool of this process judges on {existing.device}, not {device}")
        return existing


def cluster_plan(device: str, address: str | None = None, gpus: list[int] | None = None) -> DevicePlan:
    """The device plan of the cluster at ``address`` (a local one when None): one lane per GPU
    actor (lane ids are actor slots), the build targets of every GPU capability present.
    ``gpus`` (local cluster only) restricts it to those GPU indices."""
    if gpus is not None and address is None and not _pools:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)  # what the local Ray sees
    return pool(address, device).plan(address)


def actor_pids(address: str | None, device: str) -> list[int]:
    """Process ids of the pool's current actors (for tests and diagnostics)."""
    p = pool(address, device)
    return [p.describe(s)["pid"] for s in p.slots]


# ---- one batch (driver side) -----------------------------------------------------------------------

def run_jobs_ray(jobs: list[Job], config: EvalConfig, *, plan: DevicePlan,
                 on_result: Callable[[int, EvalResult], None] | None = None,
                 on_stats: Callable[[BatchStats], None] | None = None,
                 follow: Callable[[int, EvalResult], list[Job]] | None = None) -> list[EvalResult]:
    """See the module docstring; the same contract as the local ``run_jobs`` (``follow``'s jobs:
    :func:`in_rounds`)."""
    if follow is not None:
        return in_rounds(lambda batch, each, stats: run_jobs_ray(batch, config, plan=plan, on_result=each,
                                                                  on_stats=stats),
                         jobs, on_result, on_stats, follow)
    return _RayBatch(pool(plan.ray_address, plan.device), jobs, config, on_result).run(on_stats)


def in_rounds(run: Callable[[list[Job], Callable[[int, EvalResult], None], Callable[[BatchStats], None]],
                            list[EvalResult]],
              jobs: list[Job], on_result: Callable[[int, EvalResult], None] | None,
              on_stats: Callable[[BatchStats], None] | None,
              follow: Callable[[int, EvalResult], list[Job]]) -> list[EvalResult]:
    """``follow`` for a backend whose batches take a fixed list: ``run(jobs, on_result, on_stats)``
    once for ``jobs``, then once for the jobs their verdicts returned, and so on; indices and
    results as one batch's, ``on_stats`` once with the rounds' stats merged."""
    results: list[EvalResult] = []
    stats: list[BatchStats] = []
    todo = list(jobs)
    while todo:
        base, more = len(results), []

        def each(i: int, res: EvalResult, base: int = base, more: list[Job] = more) -> None:
            if on_result is not None:
                on_result(base + i, res)
            more.extend(follow(base + i, res))

        results.extend(run(todo, each, stats.append))
        todo = more
    merged = total(stats)
    if on_stats is not None and merged is not None:
        on_stats(merged)
    return results


class _RayBatch:
    def __init__(self, pool_: ActorPool, jobs: list[Job], config: EvalConfig,
                 on_result: Callable[[int, EvalResult], None] | None) -> None:
        from cudal1.harness.parent.farm import BuildBudget

        self.pool, self.ray, self.jobs, self.config, self.on_result = pool_, pool_.ray, jobs, config, on_result
        lanes_per_node = max(1, len(pool_.slots) // max(1, len({s.node for s in pool_.slots})))
        cpus = pool_.cpus()
        self.budget = BuildBudget.detect(config.build_workers, lanes_per_node, cores=cpus)
        self.max_builds = max(
            1, min(self.budget.workers if config.build_workers else cpus, cpus // self.budget.max_jobs or 1)
        )
        self.seed = config.input_seed if config.input_seed is not None else secrets.randbelow(2**31)
        self.rec = StatsRecorder("ray", jobs, self.max_builds, self.budget.max_jobs)
        self.results: list[EvalResult | None] = [None] * len(jobs)
        self.ready: list[int] = []  # jobs whose build is done (or needs none), in job order
        self.prebuilt: dict[int, Any] = {}  # job -> (outcome, cached)
        self.built_on: dict[int, str] = {}  # job -> node of its build
        self.attempts = [0] * len(jobs)
        self.retries = 0
        self.lane_jobs: dict[int, list[tuple[int, float, int, float]]] = {s.index: [] for s in pool_.slots}
        self.first_dispatch: dict[int, float] = {}

    # builds ---------------------------------------------------------------------------------------
    def _plan_builds(self) -> tuple[list[int], dict[str, list[int]]]:
        from cudal1.harness import build

        groups: dict[str, list[int]] = {}
        for i, job in enumerate(self.jobs):
            if job.candidate is not None and build.needs_build(job.candidate):
                groups.setdefault(content_hash("build", job.candidate.source, self.pool.arch_list), []).append(i)
            else:
                self.ready.append(i)
        return list(groups), groups

    def run(self, on_stats: Callable[[BatchStats], None] | None) -> list[EvalResult]:
        from cudal1.harness.parent.farm import shared

        ray, t0 = self.ray, time.monotonic()
        keys, groups = self._plan_builds()
        build_refs: dict[Any, tuple[str, float]] = {}
        evals: dict[Any, tuple[int, Slot, Any]] = {}  # ref -> (job, slot, the actor it went to)
        build_opts = self.pool.build_fn.options(num_cpus=self.budget.max_jobs)
        while keys or build_refs or evals or self.ready:
            if drain.requested():  # the jobs out finish; nothing else is built or dispatched
                keys.clear()
                self.ready.clear()
            while keys and len(build_refs) < self.max_builds:
                key = keys.pop(0)
                job = self.jobs[groups[key][0]]
                ref = build_opts.remote(self.config, self.seed, self.pool.arch_list, self.budget.max_jobs, job)
                build_refs[ref] = (key, time.monotonic())
                self.rec.build_started()
            self._dispatch(evals)
            refs = list(build_refs) + list(evals)
            if not refs:
                continue
            done, _ = ray.wait(refs, num_returns=1, timeout=1.0)
            for ref in done:
                if ref in build_refs:
                    key, submitted = build_refs.pop(ref)
                    self.rec.build_finished()
                    self._built(ref, groups[key], submitted, shared)
                else:
                    self._judged(ref, *evals.pop(ref), t0)
        self._close()
        missing = [i for i, r in enumerate(self.results) if r is None]
        drain.check(len(missing))
        if missing:
            raise HarnessError(f"internal error: no result for job(s) {missing}")
        if on_stats is not None:
            on_stats(self._stats(t0))
        return self.results  # type: ignore[return-value]

    def _built(self, ref: Any, members: list[int], submitted: float, shared: Callable[[Any], Any]) -> None:
        received = time.monotonic()
        try:
            info = self.ray.get(ref)
        except Exception:  # noqa: BLE001 - lost even after Ray's retries: the judging worker builds it
            info = None
        leader = members[0]
        if info is not None:
            self.prebuilt[leader] = (info["outcome"], info["cached"])
            for i in members[1:]:
                self.prebuilt[i] = (shared(info["outcome"]), True)
            for i in members:
                self.built_on[i] = info["node"]
            queue_s = max(0.0, received - submitted - info["build_s"])
            self.rec.build(
                leader, "cached" if info["cached"] else "built", queue_s, info["build_s"], info["lock_wait_s"]
            )
            for i in members[1:]:
                self.rec.build(i, "shared")
        self.ready.extend(members)
        self.ready.sort()

    def _dispatch(self, evals: dict[Any, tuple[int, Slot, Any]]) -> None:
        for slot in sorted(self.pool.slots, key=lambda s: len(s.inflight)):
            while self.ready and len(slot.inflight) < INFLIGHT_PER_ACTOR:
                local = next((i for i in self.ready if self.built_on.get(i, slot.node) == slot.node), self.ready[0])
                self.ready.remove(local)
                self.attempts[local] += 1
                ref = slot.handle.evaluate.remote(self.config, self.seed, self.pool.arch_list, self.budget.max_jobs,
                                                  self.jobs[local], self.prebuilt.get(local))
                slot.inflight.append(ref)
                self.first_dispatch.setdefault(slot.index, time.monotonic())
                evals[ref] = (local, slot, slot.handle)

    def _judged(self, ref: Any, i: int, slot: Slot, handle: Any, t0: float) -> None:
        from ray.exceptions import RayActorError

        if ref in slot.inflight:
            slot.inflight.remove(ref)
        try:
            result, judge_s = self.ray.get(ref)
        except RayActorError as exc:
            self._lost(i, slot, handle, exc)
            return
        self.results[i] = result
        self.lane_jobs[slot.index].append((i, judge_s, self.attempts[i], in_worker_build_s(result)))
        if self.on_result is not None:
            self.on_result(i, result)

    def _lost(self, i: int, slot: Slot, dead: Any, exc: BaseException) -> None:
        """The actor died with job ``i`` (and perhaps others) in flight: a fresh actor takes the
        slot (once: its other in-flight jobs land here too); the job runs again unless it has
        had its attempts."""
        if slot.handle is dead:
            self.pool.replace(slot)
        if self.attempts[i] < MAX_ATTEMPTS:
            self.retries += 1
            self.ready.insert(0, i)
            return
        job = self.jobs[i]
        self.results[i] = EvalResult(
            status=Status.RUNTIME_ERROR, task_name=job.task.name, task_hash=job.task.hash,
            candidate_hash=job.candidate.hash if job.candidate else f"baseline:{job.baseline_mode}",
            message=f"judge: the timing actor died {MAX_ATTEMPTS} times while judging this job ({type(exc).__name__})",
            config_hash=self.config.hash(), phase="judge")
        if self.on_result is not None:
            self.on_result(i, self.results[i])

    def _close(self) -> None:
        for slot in self.pool.slots:
            try:
                slot.handle.close.remote(self.seed)
            except Exception:  # noqa: BLE001 - a dead actor has nothing to clean
                pass

    def _stats(self, t0: float) -> BatchStats:
        wall = time.monotonic() - t0
        for slot in self.pool.slots:
            lane, done = slot.index, self.lane_jobs[slot.index]
            self.rec.lane_start(lane)
            startup = min(wall, self.first_dispatch.get(lane, t0 + wall) - t0)
            self.rec.lane_wait(lane, startup)
            for i, judge_s, attempts, in_worker in done:
                self.rec.judged(lane, i, judge_s, attempts, worker_build_s=in_worker)
            busy = sum(j for _, j, _, _ in done)
            self.rec.lane_wait(lane, max(0.0, wall - startup - busy))
            self.rec.lane_end(lane, max(wall, startup + busy))
        return self.rec.finish(self.retries)
