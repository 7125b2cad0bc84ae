"""Device plan and scheduling: which GPUs time candidates, and how a batch of jobs is spread over
build processes and timing lanes.

Contract: untrusted code (reference and candidates) runs only in worker children; this process
never imports it.  :func:`run_jobs` overlaps builds and timing: every candidate that compiles
extensions is handed to the build farm (:mod:`cudal1.harness.farm`: CPU children sized to the
machine, one build per distinct source, a file lock per build directory) the moment the batch
starts, while one timing lane per GPU (one lane on CPU) evaluates whatever is *ready* (no build,
or its build finished); a lane with nothing ready sleeps until a build finishes, so it never
commits to a build that has not started.  ``plan.backend == "ray"`` runs the same jobs on a Ray
cluster (:mod:`cudal1.harness.ray_backend`).  ``on_stats`` receives a
:class:`~cudal1.harness.batchstats.BatchStats` (build queue, build, judge, lane idle) per batch.
Nothing here raises for candidate behaviour; bad *usage* (no GPU when ``device='cuda'``) raises
:class:`HarnessError`.  Results come back in job order.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cudal1.config import TOLERANCES, EvalConfig
from cudal1.harness import build
from cudal1.harness.assemble import assemble
from cudal1.harness.batchstats import BatchStats, StatsRecorder, in_worker_build_s
from cudal1.harness.envinfo import Gpu, gpu_inventory
from cudal1.harness.sandbox import JobOutcome, run_job
from cudal1.harness.spec import ExactCacheSpec, WorkerSpec
from cudal1.types import Candidate, EvalResult, Status, Task, content_hash


class HarnessError(RuntimeError):
    """Bad usage of the judge (not a verdict on a candidate)."""


BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class DevicePlan:
    device: str  # "cuda" | "cpu"
    lanes: tuple[int | None, ...]  # GPU index per timing lane; (None,) on CPU
    arch_list: str  # TORCH_CUDA_ARCH_LIST for builds ("" on CPU): each distinct capability once, no PTX
    driver: str | None = None
    backend: str = "local"  # local (threads + processes here) | ray (actors and tasks on a Ray cluster)
    ray_address: str | None = None  # None with backend ray: a local cluster started on demand

    def with_backend(self, backend: str, ray_address: str | None = None) -> "DevicePlan":
        if backend not in BACKENDS:
            raise HarnessError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
        return dataclasses.replace(self, backend=backend, ray_address=ray_address if backend == "ray" else None)

    def hardware_name(self) -> str:
        """What judges this plan's candidates, for run records: the GPU model(s), "CPU", or the Ray cluster."""
        if self.backend == "ray":
            return f"Ray cluster ({len(self.lanes)} {'GPU' if self.device == 'cuda' else 'CPU'} lane(s))"
        if self.device != "cuda":
            return "CPU"
        return ", ".join(sorted({g.name for g in gpu_inventory() if g.index in self.lanes})) or "CUDA GPU"

    @classmethod
    def detect(cls, device: str, gpus: list[int] | None = None) -> "DevicePlan":
        inventory: list[Gpu] = gpu_inventory() if device in ("auto", "cuda") else []
        if gpus is not None:
            inventory = [g for g in inventory if g.index in gpus]
        if device == "cuda" and not inventory:
            raise HarnessError("--device cuda: no NVIDIA GPU found (nvidia-smi lists none)")
        if not inventory:
            return cls("cpu", (None,), "")
        arch = ";".join(sorted({g.capability for g in inventory}))
        return cls("cuda", tuple(g.index for g in inventory), arch, inventory[0].driver)


@dataclass
class Job:
    """One unit of work for a timing lane: a candidate, or a baseline mode, for a task."""

    task: Task
    candidate: Candidate | None = None
    baseline_mode: str | None = None

    @property
    def label(self) -> str:
        return self.baseline_mode or (self.candidate.label if self.candidate else "")


def _limits(config: EvalConfig) -> dict[str, float]:
    return {
        "setup": config.setup_timeout_s,
        "import": config.build_timeout_s,
        "build": config.build_timeout_s,
        "construct": config.timeout_s,
        "correctness": config.timeout_s,
        "timing": config.timeout_s,
        "verify": config.timeout_s,
        "verify_timing": config.timeout_s,
        "reference": config.timeout_s,
        # waiting for the GPU lease: other workers' GPU phases (each under its own deadline)
        "lane": 4 * config.timeout_s * max(1, config.workers_per_gpu - 1),
        "default": config.timeout_s,
    }


def lease_path(plan: "DevicePlan", config: EvalConfig, gpu: int | None) -> str | None:
    """The lock file of a lane's GPU lease (see ``Worker.lease``): one per physical GPU on this
    machine, shared by every cudal1 process, so timing is exclusive across runs too; on the CPU
    only when several workers share it (``workers_per_gpu`` > 1), per cache root."""
    if plan.device == "cuda" and gpu is not None:
        root = Path(tempfile.gettempdir()) / "cudal1-leases"
        name = f"gpu{gpu}.lock"
    elif config.workers_per_gpu > 1:
        root, name = config.cache_root() / "leases", "cpu.lock"
    else:
        return None
    root.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(root, 0o1777)  # other users' runs on this machine share the GPU's lease
    except OSError:
        pass
    return str(root / name)


class Evaluator:
    """Runs jobs through the sandbox on a device plan.  Thread-safe; one per batch."""

    def __init__(self, config: EvalConfig, plan: DevicePlan, *, max_jobs: int | None = None,
                 input_seed: int | None = None) -> None:
        self.config = config
        self.plan = plan
        self.cache_root = config.cache_root()
        self.max_jobs = max_jobs or max(2, (os.cpu_count() or 2) // 2)  # MAX_JOBS of each build (see farm.BuildBudget)
        if input_seed is None:
            input_seed = config.input_seed if config.input_seed is not None else secrets.randbelow(2**31)
        self.input_seed = input_seed
        self.static_names = self._static_names(config.static_guards)
        self._exact_lock = threading.Lock()
        self._exact_digests: dict[Path, str] = {}  # float64-answer file -> digest a worker sent before candidate code ran
        self.on_timeline: Callable[[int | None, list[tuple[str, float, float]]], None] | None = None  # (gpu, phases)

    def exact_cache(self, task: Task, device: str) -> ExactCacheSpec:
        """Where the float64 answers of ``task``'s correctness inputs live for this batch, and the
        digest the worker must find there (None until a worker computed them)."""
        key = content_hash("exact", f"{task.hash}|{self.input_seed}|{self.config.seed}|{self.config.correctness_trials}|{device}")
        path = self.cache_root / "exact" / f"{key[:24]}.pt"
        with self._exact_lock:
            return ExactCacheSpec(str(path), self._exact_digests.get(path))

    def _remember_exact(self, spec: WorkerSpec, outcome: JobOutcome) -> None:
        digest, cache = outcome.task.exact_digest, spec.exact_cache
        if digest and cache:
            with self._exact_lock:
                self._exact_digests[Path(cache.path)] = digest

    def close(self) -> None:
        """Remove this batch's float64-answer files (their input seed is never used again)."""
        with self._exact_lock:
            for path in self._exact_digests:
                path.unlink(missing_ok=True)
            self._exact_digests.clear()

    @staticmethod
    def _static_names(spec: str) -> list[str]:
        from cudal1.harness.static_guard import CHECKS

        spec = spec.strip()
        names = [] if spec == "none" else list(CHECKS) if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
        unknown = [n for n in names if n not in CHECKS]
        if unknown:
            raise HarnessError(f"unknown static guard(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
        return names

    def _worker_job(self, job: Job, workdir: Path, device: str, gpu: int | None, mode: str) -> WorkerSpec:
        task, cand = job.task, job.candidate
        ref_path = workdir / f"ref_{task.hash[:12]}.py"
        ref_path.write_text(task.source)
        env = {"TORCH_CUDA_ARCH_LIST": self.plan.arch_list} if self.plan.arch_list else {}
        env["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else str(gpu)
        tolerances = TOLERANCES[self.config.tolerance]
        reference_module = f"cudal1_reference_{task.hash[:12]}"
        cand_path = cand_module = None
        cwd = workdir  # never the user's directory: candidates write relative paths ('cuda_extensions/')
        if cand is not None:
            cand_module = f"cudal1_candidate_{cand.hash[:12]}"
            bdir = build.build_dir(self.cache_root, cand, self.plan.arch_list)
            # The candidate's own directory, shared by its pre-build and every evaluation: a relative
            # ``build_directory=`` or one next to ``__file__`` finds what the pre-build compiled.
            cwd = bdir / "cwd"
            cwd.mkdir(parents=True, exist_ok=True)
            cand_path = cwd / f"cand_{cand.hash[:12]}_{mode}.py"
            text = build.prebuild_source(cand.source, reference_module) if mode == "build" else cand.source
            staged = workdir / cand_path.name
            staged.write_text(text)
            os.replace(staged, cand_path)  # atomic: lanes judging the same source never see half a file
            env["TORCH_EXTENSIONS_DIR"] = str(bdir)
            env["MAX_JOBS"] = str(self.max_jobs)
        return WorkerSpec(
            mode=mode,
            device=device,
            config=self.config,
            tolerances=tolerances,
            input_seed=self.input_seed,
            reference_path=str(ref_path),
            reference_module=reference_module,
            log_path=str(workdir / "worker.log"),
            env=env,
            candidate_path=str(cand_path) if cand_path else None,
            candidate_module=cand_module,
            baseline_mode=job.baseline_mode,
            exact_cache=self.exact_cache(task, device) if mode != "build" and "@exact" in tolerances else None,
            cwd=str(cwd),
            gpu_lease=lease_path(self.plan, self.config, gpu) if mode != "build" else None,
        )

    def _run(self, job: Job, device: str, gpu: int | None, mode: str) -> JobOutcome:
        (self.cache_root / "work").mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="job_", dir=self.cache_root / "work"))
        try:
            spec = self._worker_job(job, workdir, device, gpu, mode)
            outcome = run_job(spec, _limits(self.config))
            self._remember_exact(spec, outcome)
            if mode != "build" and self.on_timeline is not None:
                self.on_timeline(gpu, outcome.timeline)
            return outcome
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def static_findings(self, candidate: Candidate, task: Task) -> list:
        from cudal1.harness.static_guard import run_static_guards

        return run_static_guards(candidate.source, self.static_names, reference=task.source) if self.static_names else []

    def build_dir(self, job: Job) -> Path:
        assert job.candidate is not None
        return build.build_dir(self.cache_root, job.candidate, self.plan.arch_list)

    def prebuild(self, job: Job) -> tuple[JobOutcome, bool]:
        """Import the candidate on the CPU with no GPU visible; returns (outcome, was_cached)."""
        cached = build.has_built_library(self.build_dir(job))
        return self._run(job, "cpu", None, "build"), cached

    def evaluate_job(self, job: Job, gpu: int | None, prebuilt: tuple[JobOutcome, bool] | None) -> EvalResult:
        base = EvalResult(
            status=Status.RUNTIME_ERROR,
            task_name=job.task.name,
            task_hash=job.task.hash,
            candidate_hash=job.candidate.hash if job.candidate else f"baseline:{job.baseline_mode}",
        )
        if job.candidate is not None:
            findings = self.static_findings(job.candidate, job.task)
            rejects = [f for f in findings if f.reject]
            if rejects:
                base.status = Status.REJECTED
                base.flags = list(dict.fromkeys(f.flag for f in rejects))
                base.message = "static guard: " + "; ".join(f"line {f.line}: {f.message}" for f in rejects)
                base.config_hash = self.config.hash()
                base.phase = "static"
                return base
        if prebuilt is not None:
            outcome, cached = prebuilt
            v = outcome.result
            if v is not None and v.status == "compile_error" and v.build.build_error:
                return assemble(outcome, self.config, base)  # a real compiler error: no GPU needed
        mode = "baseline" if job.baseline_mode else "eval"
        result = assemble(self._run(job, self.plan.device, gpu, mode), self.config, base)
        if prebuilt is not None:
            result.build_s = max(result.build_s, prebuilt[0].built.build_s or 0.0 if prebuilt[0].built else 0.0)
            result.wall_s += prebuilt[0].wall_s  # the pre-build is part of what this candidate cost
            if prebuilt[1]:
                result.flags.append("build_cached")
        if job.candidate is not None:
            result.flags.extend(f.flag for f in self.static_findings(job.candidate, job.task) if f.flag not in result.flags)
        if self.plan.driver and not result.environment.driver:
            result.environment.driver = self.plan.driver
        return result


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
        from cudal1.harness.ray_backend import run_jobs_ray

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

    def enter(self, stopping: Callable[[], bool]) -> None:
        with self.cond:
            while self.solo and not stopping():
                self.cond.wait(timeout=1.0)
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


class _LocalBatch:
    """One batch on this machine: a build farm feeding one thread per timing lane."""

    def __init__(self, jobs: list[Job], config: EvalConfig, plan: DevicePlan,
                 on_result: Callable[[int, EvalResult], None] | None) -> None:
        from cudal1.harness.farm import BuildBudget

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
        from cudal1.harness.farm import BuildFarm

        farm = self.farm = BuildFarm(self.ev.prebuild, self.ev.build_dir, self.budget, self.ready,
                                     stale_after_s=self.config.build_timeout_s + 60.0,
                                     on_start=self.rec.build_started, on_done=lambda t: self.rec.build_finished())
        try:
            for i, job in enumerate(self.jobs):
                if job.candidate is not None and build.needs_build(job.candidate):
                    self.tickets[i] = farm.submit(job)
            share = self.config.workers_per_gpu
            lanes = [(g, g if share == 1 else f"{'cpu' if g is None else g}/{k}") for g in self.plan.lanes for k in range(share)]
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
        if missing:
            raise HarnessError(f"internal error: no result for job(s) {missing}")
        self._record_builds()
        if on_stats is not None:
            on_stats(self.rec.finish())
        return self.results  # type: ignore[return-value]

    def stop(self) -> None:
        """Interrupt the batch: no lane takes another job, the verdicts of jobs still running are
        dropped (their workers and pre-builds are killed), recorded ones stay."""
        from cudal1.harness import sandbox

        with self.ready:
            self.stopping = True
            self.ready.notify_all()
        if self.farm is not None:
            self.farm.stop()
        sandbox.stop_all()

    def take(self) -> int | None:
        """The first pending job that is ready (no build, or its build done); sleeps until a
        build finishes when none is; None when nothing is left (or a lane failed)."""
        with self.ready:
            while True:
                if self.failures or self.stopping or not self.pending:
                    return None
                ready = next((i for i in self.pending if i not in self.tickets or self.tickets[i].done), None)
                if ready is not None:
                    self.pending.remove(ready)
                    return ready
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
        memory is judged again with the GPU to itself (:class:`GpuGate`); flag ``rejudged_alone``."""
        gate, stopping = self.gates[gpu], lambda: self.stopping
        gate.enter(stopping)
        try:
            res = self.ev.evaluate_job(self.jobs[i], gpu, prebuilt)
        finally:
            gate.leave()
        if self.config.workers_per_gpu > 1 and out_of_memory(res) and not self.stopping:
            res = gate.alone(lambda: self.ev.evaluate_job(self.jobs[i], gpu, prebuilt), stopping)
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
