"""The judge's front door: ``evaluate(task, candidates, config) -> list[EvalResult]``.

Contract: untrusted code (reference and candidates) runs only in worker children; the caller's
process never imports it.  Batches are scheduled so that builds overlap timing: candidates that
compile extensions are pre-built in parallel CPU children first, while one timing lane per GPU
(one lane on CPU) evaluates whatever is ready.  With a :class:`~cudal1.store.RunStore`, finished
evaluations are recorded as they complete and already-recorded ones are returned without
re-running (resume).  Nothing here raises for candidate behaviour; bad *usage* (no GPU when
``device='cuda'``) raises :class:`HarnessError`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cudal1.config import TOLERANCES, EvalConfig
from cudal1.harness import build
from cudal1.harness.assemble import assemble
from cudal1.harness.envinfo import Gpu, gpu_inventory
from cudal1.harness.sandbox import JobOutcome, run_job
from cudal1.types import Candidate, EvalResult, Status, Task


class HarnessError(RuntimeError):
    """Bad usage of the judge (not a verdict on a candidate)."""


@dataclass(frozen=True)
class DevicePlan:
    device: str  # "cuda" | "cpu"
    lanes: tuple[int | None, ...]  # GPU index per timing lane; (None,) on CPU
    arch_list: str  # TORCH_CUDA_ARCH_LIST for builds ("" on CPU)
    driver: str | None = None

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
        "default": config.timeout_s,
    }


class Evaluator:
    """Runs jobs through the sandbox on a device plan.  Thread-safe; one per batch."""

    def __init__(self, config: EvalConfig, plan: DevicePlan) -> None:
        self.config = config
        self.plan = plan
        self.cache_root = config.cache_root()
        self.input_seed = config.input_seed if config.input_seed is not None else secrets.randbelow(2**31)
        self.static_names = self._static_names(config.static_guards)

    @staticmethod
    def _static_names(spec: str) -> list[str]:
        from cudal1.harness.static_guard import CHECKS

        spec = spec.strip()
        names = [] if spec == "none" else list(CHECKS) if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
        unknown = [n for n in names if n not in CHECKS]
        if unknown:
            raise HarnessError(f"unknown static guard(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
        return names

    def _worker_job(self, job: Job, workdir: Path, device: str, gpu: int | None, mode: str) -> dict:
        task, cand = job.task, job.candidate
        ref_path = workdir / f"ref_{task.hash[:12]}.py"
        ref_path.write_text(task.source)
        env = {"TORCH_CUDA_ARCH_LIST": self.plan.arch_list} if self.plan.arch_list else {}
        env["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else str(gpu)
        spec = {
            "mode": mode,
            "device": device,
            "config": self.config.to_dict(),
            "tolerances": TOLERANCES[self.config.tolerance],
            "input_seed": self.input_seed,
            "reference_path": str(ref_path),
            "reference_module": f"cudal1_reference_{task.hash[:12]}",
            "log_path": str(workdir / "worker.log"),
            "baseline_mode": job.baseline_mode,
            "env": env,
        }
        if cand is not None:
            cand_path = workdir / f"cand_{cand.hash[:12]}.py"
            cand_path.write_text(cand.source)
            spec["candidate_path"] = str(cand_path)
            spec["candidate_module"] = f"cudal1_candidate_{cand.hash[:12]}"
            bdir = build.build_dir(self.cache_root, cand, self.plan.arch_list)
            bdir.mkdir(parents=True, exist_ok=True)
            env["TORCH_EXTENSIONS_DIR"] = str(bdir)
            env.setdefault("MAX_JOBS", str(max(2, (os.cpu_count() or 2) // 2)))
        return spec

    def _run(self, job: Job, device: str, gpu: int | None, mode: str) -> JobOutcome:
        (self.cache_root / "work").mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="job_", dir=self.cache_root / "work"))
        try:
            return run_job(self._worker_job(job, workdir, device, gpu, mode), _limits(self.config))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def static_findings(self, candidate: Candidate, task: Task) -> list:
        from cudal1.harness.static_guard import run_static_guards

        return run_static_guards(candidate.source, self.static_names, reference=task.source) if self.static_names else []

    def prebuild(self, job: Job) -> tuple[JobOutcome, bool]:
        """Import the candidate on the CPU with no GPU visible; returns (outcome, was_cached)."""
        assert job.candidate is not None
        cached = build.has_built_library(build.build_dir(self.cache_root, job.candidate, self.plan.arch_list))
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
            data = outcome.result or {}
            if data.get("status") == "compile_error" and data.get("build_error"):
                return assemble(outcome, self.config, base)  # a real compiler error: no GPU needed
        mode = "baseline" if job.baseline_mode else "eval"
        result = assemble(self._run(job, self.plan.device, gpu, mode), self.config, base)
        if prebuilt is not None:
            result.build_s = max(result.build_s, float((prebuilt[0].built or {}).get("build_s", 0.0)))
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
) -> list[EvalResult]:
    """Evaluate ``jobs``: parallel pre-builds, one timing lane per GPU.  Order is preserved."""
    plan = plan or DevicePlan.detect(config.device)
    ev = Evaluator(config, plan)
    results: list[EvalResult | None] = [None] * len(jobs)
    workers = config.build_workers or min(8, os.cpu_count() or 2)
    pending = list(range(len(jobs)))
    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cudal1-build") as builder:
        builds: dict[int, Future] = {
            i: builder.submit(ev.prebuild, jobs[i])
            for i in pending
            if jobs[i].candidate is not None and build.needs_build(jobs[i].candidate)
        }

        def take() -> int | None:
            with lock:
                if not pending:
                    return None
                ready = next((i for i in pending if i not in builds or builds[i].done()), pending[0])
                pending.remove(ready)
                return ready

        failures: list[BaseException] = []

        def lane(gpu: int | None) -> None:
            while not failures and (i := take()) is not None:
                try:
                    prebuilt = builds[i].result() if i in builds else None
                    res = ev.evaluate_job(jobs[i], gpu, prebuilt)
                    results[i] = res
                    if on_result is not None:
                        on_result(i, res)
                except BaseException as exc:  # noqa: BLE001 - re-raised after the join
                    failures.append(exc)

        threads = [threading.Thread(target=lane, args=(g,), name=f"cudal1-lane-{g}") for g in plan.lanes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failures:
        raise failures[0]
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        raise HarnessError(f"internal error: no result for job(s) {missing}")
    return results  # type: ignore[return-value]


def evaluate(task: Task, candidates: list[Candidate], config: EvalConfig | None = None, *, store=None) -> list[EvalResult]:
    """Judge each candidate against ``task``.  With ``store``, resume and record as they finish."""
    config = config or EvalConfig()
    return evaluate_pairs([(task, c) for c in candidates], config, store=store)


Reviewer = Callable[[Task, Candidate], "str | None"]


def evaluate_pairs(pairs: list[tuple[Task, Candidate]], config: EvalConfig, *, store=None, plan: DevicePlan | None = None,
                   on_result: Callable[[EvalResult], None] | None = None,
                   reviewer: Reviewer | None = None) -> list[EvalResult]:
    """Judge (task, candidate) pairs, possibly of many tasks; results in input order.

    ``reviewer`` (optional, e.g. an LLM second opinion supplied by the caller; the judge knows
    nothing of LLMs) is asked about each ``ok`` result; a reason it returns becomes the
    informational flag ``reviewer_suspects`` and a line of the message.  It never changes a
    verdict, and an exception from it is ignored."""
    results: list[EvalResult | None] = [None] * len(pairs)
    todo: list[int] = []
    for i, (task, cand) in enumerate(pairs):
        previous = store.get_evaluation(task.hash, cand.hash, config.hash()) if store else None
        if previous is not None:
            results[i] = previous
        else:
            todo.append(i)
    if store is not None:
        for task, cand in pairs:
            store.add_task(task)
            store.add_candidate(cand, task.hash)

    def record(j: int, res: EvalResult) -> None:
        results[todo[j]] = res
        if store is not None:
            store.record_evaluation(res)
        if on_result is not None:
            on_result(res)

    if todo:
        run_jobs([Job(pairs[i][0], pairs[i][1]) for i in todo], config, plan=plan, on_result=record)
        if reviewer is not None:  # after the batch, so a slow reviewer never stalls a GPU lane
            _review([(pairs[i], results[i]) for i in todo], reviewer, store)
    return [r for r in results if r is not None]


def _review(done: list, reviewer: Reviewer, store) -> None:
    for (task, cand), res in done:
        if res is None or res.status is not Status.OK:
            continue
        try:
            reason = reviewer(task, cand)
        except Exception:  # noqa: BLE001 - a second opinion must never break judging
            reason = None
        if reason:
            res.flags.append("reviewer_suspects")
            res.message = (res.message + "\n" if res.message else "") + f"reviewer: {reason}"
            if store is not None:
                store.record_evaluation(res)


def environment_key(plan: DevicePlan) -> str:
    """Baseline cache identity for this machine: device, GPU name, torch and CUDA versions."""
    import torch

    from cudal1.harness.envinfo import gpu_inventory as _inventory
    from cudal1.types import Environment

    name = None
    if plan.device == "cuda":
        names = {g.name for g in _inventory() if g.index in plan.lanes}
        name = ",".join(sorted(names))
    return Environment(device=plan.device, gpu_name=name, torch=torch.__version__, cuda=torch.version.cuda).key()


def measure_baselines(tasks: list[Task], modes: list[str], config: EvalConfig, *, store=None, plan: DevicePlan | None = None,
                      on_result: Callable[[EvalResult], None] | None = None) -> dict[tuple[str, str], EvalResult]:
    """Time each task's reference under each mode against eager; cached per
    (task hash, mode, environment, config) in ``store``.  Returns {(task hash, mode): result}."""
    from cudal1.harness.baselines import check_modes

    plan = plan or DevicePlan.detect(config.device)
    modes = check_modes(modes, plan.device)
    env_key = environment_key(plan)
    out: dict[tuple[str, str], EvalResult] = {}
    jobs: list[Job] = []
    for task in tasks:
        for mode in modes:
            cached = store.get_baseline(task.hash, mode, env_key, config.hash()) if store else None
            if cached is not None:
                out[(task.hash, mode)] = cached
            else:
                jobs.append(Job(task, None, mode))

    def record(i: int, res: EvalResult) -> None:
        job = jobs[i]
        out[(job.task.hash, job.baseline_mode or "")] = res
        if store is not None:
            store.record_baseline(job.task.hash, job.baseline_mode, env_key, config.hash(), res)
        if on_result is not None:
            on_result(res)

    if jobs:
        run_jobs(jobs, config, plan=plan, on_result=record)
    return out
