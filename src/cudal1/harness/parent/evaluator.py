"""One job, start to verdict: static guards, the two children's specs, the sandbox, assembly.

Contract: an :class:`Evaluator` is thread-safe and lives for one batch (its input seed is that
batch's secret).  :meth:`Evaluator.evaluate_job` never raises for anything a candidate does; a
job is the clean reference worker plus the candidate's process (:func:`cudal1.harness.parent.sandbox.run_job`),
a pre-build is the candidate's process alone on the CPU.  Untrusted code runs only in those
children; this process never imports it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from cudal1.config import EvalConfig
from cudal1.harness import build
from cudal1.harness.lease import lease_path
from cudal1.harness.parent.assemble import assemble
from cudal1.harness.parent.plan import DevicePlan, HarnessError, Job
from cudal1.harness.parent.sandbox import JobOutcome, run_job
from cudal1.harness.spec import (
    CUDA_WRITABLE,
    BuildStage,
    CandidateSettings,
    CandidateSpec,
    ExactCacheSpec,
    KnownProbe,
    PhaseLimits,
    WorkerSpec,
)
from cudal1.tolerances import TOLERANCES
from cudal1.types import Candidate, EvalResult, Status, Task, content_hash

_PHASES = ("setup", "reference", "import", "build", "compile", "compile_cpu", "construct", "correctness", "timing",
           "verify", "verify_timing")


def _limits(config: EvalConfig) -> dict[str, float]:
    """Each phase's deadline as the parent enforces it: the workers' own table
    (:meth:`PhaseLimits.of_phase`, which their stall dumps use), and the wait for the GPU lease."""
    limits = PhaseLimits.of(config)
    return {
        **{phase: limits.of_phase(phase) for phase in _PHASES},
        # waiting for the GPU lease: other workers' GPU phases (each under its own deadline)
        "lane": 4 * config.timeout_s * max(1, config.workers_per_gpu - 1),
        "default": config.timeout_s,
    }


def _own_dir(path: Path) -> Path:
    """``path`` as a real directory: a confined candidate owns its build directory, so what it left
    there may be a symbolic link, and this process must not write through it."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _chmod(path: Path, mode: int) -> None:
    try:
        os.chmod(path, mode)
    except OSError:
        pass


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
        self._exact_digests: dict[
            Path, str
        ] = {}  # float64-answer file -> digest a worker sent before candidate code ran
        self.on_timeline: Callable[[int | None, list[tuple[str, float, float]]], None] | None = None  # (gpu, phases)
        self._probes: dict[tuple[str, str], KnownProbe] = {}  # (task hash, device) -> its degenerate check

    def exact_cache(self, task: Task, device: str) -> ExactCacheSpec:
        """Where the float64 answers of ``task``'s correctness inputs live for this batch, and the
        digest the worker must find there (None until a worker computed them)."""
        key = content_hash(
            "exact", f"{task.hash}|{self.input_seed}|{self.config.seed}|{self.config.correctness_trials}|{device}"
        )
        path = self.cache_root / "exact" / f"{key[:24]}.pt"
        with self._exact_lock:
            return ExactCacheSpec(str(path), self._exact_digests.get(path))

    def known_probe(self, task: Task, device: str) -> KnownProbe | None:
        """The degenerate-task check of ``task`` on this batch's inputs, once a worker sent it."""
        with self._exact_lock:
            return self._probes.get((task.hash, device))

    def _remember_probe(self, task: Task, device: str, outcome: JobOutcome) -> None:
        if outcome.task.sent:
            with self._exact_lock:
                self._probes.setdefault((task.hash, device), KnownProbe(outcome.task.degenerate))

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
        from cudal1.harness.parent.static_guard import CHECKS

        spec = spec.strip()
        names = (
            []
            if spec == "none"
            else list(CHECKS)
            if spec == "all"
            else [n.strip() for n in spec.split(",") if n.strip()]
        )
        unknown = [n for n in names if n not in CHECKS]
        if unknown:
            raise HarnessError(f"unknown static guard(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
        return names

    def _specs(
        self, job: Job, workdir: Path, device: str, gpu: int | None, mode: str
    ) -> tuple[WorkerSpec | None, CandidateSpec]:
        """The job's two specs: the clean reference worker's (None for a pre-build) and the
        candidate's process's (no input seed, no correctness rule)."""
        task, cand = job.task, job.candidate
        ref_path = workdir / f"ref_{task.hash[:12]}.py"
        ref_path.write_text(task.source)
        os.chmod(ref_path, 0o644)  # the candidate's process imports it in baseline and pre-build modes
        env = {"TORCH_CUDA_ARCH_LIST": self.plan.arch_list} if self.plan.arch_list else {}
        env["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else str(gpu)
        tolerances = TOLERANCES[self.config.tolerance]
        reference_module = f"cudal1_reference_{task.hash[:12]}"
        cand_path = cand_module = None
        cwd = workdir  # never the user's directory: candidates write relative paths ('cuda_extensions/')
        cand_env = dict(env)
        bdir: Path | None = None
        if cand is not None:
            cand_module = f"cudal1_candidate_{cand.hash[:12]}"
            bdir = build.build_dir(self.cache_root, cand, self.plan.arch_list)
            # The candidate's own directory, shared by its pre-build and every evaluation: a relative
            # ``build_directory=`` or one next to ``__file__`` finds what the pre-build compiled.
            cwd = _own_dir(bdir / "cwd")
            cand_path = cwd / f"cand_{cand.hash[:12]}_{mode}.py"
            text = build.prebuild_source(cand.source, reference_module) if mode == "build" else cand.source
            staged = workdir / cand_path.name
            staged.write_text(text)
            os.replace(staged, cand_path)  # atomic: lanes judging the same source never see half a file
            cand_env["TORCH_EXTENSIONS_DIR"] = str(bdir)
            cand_env["MAX_JOBS"] = str(self.max_jobs)
            # compiled artifacts of torch.compile and Triton are kept per source, like builds
            cand_env["TORCHINDUCTOR_CACHE_DIR"] = str(bdir / "inductor")
            cand_env["TRITON_CACHE_DIR"] = str(bdir / "triton")
        elif self.config.baseline_cache:
            # A baseline compiles the task's own reference: one cache per task, kept across jobs, so
            # each mode compiles once per machine (a re-timing finds its kernels, a later mode reuses
            # the Triton kernels and autotuning of an earlier one).  No candidate writes there.
            bdir = _own_dir(build.baseline_dir(self.cache_root, task.source, self.plan.arch_list))
            cand_env["TORCHINDUCTOR_CACHE_DIR"] = str(bdir / "inductor")
            cand_env["TRITON_CACHE_DIR"] = str(bdir / "triton")
        slot_dir = workdir / "slots"
        slot_dir.mkdir(mode=0o711, exist_ok=True)
        confine: dict[str, Any] = {}
        if self.config.confine_candidates:
            if bdir is None:  # a baseline without its task's cache: it compiles into the job's own directory
                bdir = workdir / "build"
                bdir.mkdir(exist_ok=True)
            confine = {"build_dir": str(bdir), "home": str(workdir / "home"),
                       "tmp": str(workdir / "tmp"),
                       "writable": [str(slot_dir)] + (list(CUDA_WRITABLE) if device == "cuda" else ["/dev"])}
        candidate = CandidateSpec(
            mode=mode, device=device, settings=CandidateSettings.of(self.config), reference_path=str(ref_path),
            reference_module=reference_module, log_path=str(workdir / "candidate.log"), env=cand_env,
            candidate_path=str(cand_path) if cand_path else None, candidate_module=cand_module,
            baseline_mode=job.baseline_mode, cwd=str(cwd), confine=confine,
            display_name=(cand.label or "candidate") if cand is not None else "")
        if mode == "build":
            return None, candidate
        reference = WorkerSpec(
            mode=mode,
            device=device,
            config=self.config,
            tolerances=tolerances,
            input_seed=self.input_seed,
            reference_path=str(ref_path),
            reference_module=reference_module,
            log_path=str(workdir / "reference.log"),
            env=env,
            candidate_path=None,
            candidate_module=None,
            baseline_mode=job.baseline_mode,
            exact_cache=self.exact_cache(task, device) if tolerances.exact is not None else None,
            known_probe=self.known_probe(task, device),
            cwd=str(workdir),
            gpu_lease=lease_path(self.plan.device, gpu, self.config.workers_per_gpu, self.cache_root),
            slot_dir=str(slot_dir),
        )
        return reference, candidate

    def _run(self, job: Job, device: str, gpu: int | None, mode: str) -> JobOutcome:
        work = self.cache_root / "work"
        work.mkdir(parents=True, exist_ok=True)
        _chmod(work, 0o711)  # job directories are not listed: another candidate cannot find their slots
        workdir = Path(tempfile.mkdtemp(prefix="job_", dir=work))
        _chmod(workdir, 0o711)
        try:
            spec, candidate = self._specs(job, workdir, device, gpu, mode)
            outcome = run_job(spec, candidate, _limits(self.config), gpu if device == "cuda" else None)
            if spec is not None:
                self._remember_exact(spec, outcome)
                self._remember_probe(job.task, device, outcome)
            if mode != "build" and self.on_timeline is not None:
                self.on_timeline(gpu, outcome.timeline)
            return outcome
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def static_findings(self, candidate: Candidate, task: Task) -> list:
        from cudal1.harness.parent.static_guard import run_static_guards

        return (
            run_static_guards(candidate.source, self.static_names, reference=task.source) if self.static_names else []
        )

    def build_dir(self, job: Job) -> Path:
        assert job.candidate is not None
        return build.build_dir(self.cache_root, job.candidate, self.plan.arch_list)

    def prebuild(self, job: Job) -> tuple[JobOutcome, bool]:
        """Import the candidate on the CPU with no GPU visible; returns (outcome, was_cached).
        A source whose pre-build already imported cleanly under this toolchain is not imported
        again (:func:`build.was_prebuilt`): nothing is left to build, and the child would cost
        about half a second of a fresh interpreter and torch import for nothing."""
        path = self.build_dir(job)
        if build.was_prebuilt(path):
            return JobOutcome(phase="import", built=BuildStage(build_s=0.0)), True
        cached = build.has_built_library(path)
        outcome = self._run(job, "cpu", None, "build")
        if outcome.result is not None and outcome.result.status == "ok" and not outcome.timed_out:
            build.mark_prebuilt(path)
        return outcome, cached

    def evaluate_job(self, job: Job, gpu: int | None, prebuilt: tuple[JobOutcome, bool] | None) -> EvalResult:
        base = EvalResult(
            status=Status.RUNTIME_ERROR,
            task_name=job.task.name,
            task_hash=job.task.hash,
            candidate_hash=job.candidate.hash if job.candidate else f"baseline:{job.baseline_mode}",
        )
        findings = self.static_findings(job.candidate, job.task) if job.candidate is not None else []
        if findings:
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
        result.flags.extend(
            dict.fromkeys(f.flag for f in findings if f.flag not in result.flags)
        )  # the informational ones
        if self.plan.driver and not result.environment.driver:
            result.environment.driver = self.plan.driver
        return result
