"""The judge's front door: ``evaluate(task, candidates, config) -> list[EvalResult]``.

Contract: untrusted code (reference and candidates) runs only in worker children; the caller's
process never imports it.  Builds overlap timing (see :mod:`cudal1.harness.parent.batch`).  These
calls judge; they do not remember: resuming from a run store and second opinions on accepted
candidates are the apps' business (:mod:`cudal1.recorded`).  Nothing here raises for candidate
behaviour; bad *usage* (no GPU when ``device='cuda'``) raises :class:`HarnessError`.
"""

from __future__ import annotations

from typing import Callable

from cudal1.config import EvalConfig
from cudal1.harness.parent.batch import run_jobs
from cudal1.harness.parent.batchstats import BatchStats
from cudal1.harness.parent.plan import DevicePlan, HarnessError, Job
from cudal1.types import Candidate, EvalResult, Task

__all__ = ["DevicePlan", "HarnessError", "Job", "evaluate", "evaluate_pairs", "environment_key", "measure_baselines",
           "run_jobs", "time_baselines"]


def evaluate(task: Task, candidates: list[Candidate], config: EvalConfig | None = None) -> list[EvalResult]:
    """Judge each candidate against ``task``; results in input order."""
    return evaluate_pairs([(task, c) for c in candidates], config or EvalConfig())


def _each(on_result: Callable[[EvalResult], None] | None) -> Callable[[int, EvalResult], None] | None:
    """``run_jobs``' (job index, result) callback for a caller's (result) one."""
    return None if on_result is None else (lambda _, res: on_result(res))


def evaluate_pairs(pairs: list[tuple[Task, Candidate]], config: EvalConfig, *, plan: DevicePlan | None = None,
                   on_result: Callable[[EvalResult], None] | None = None) -> list[EvalResult]:
    """Judge (task, candidate) pairs, possibly of many tasks; results in input order.
    ``on_result`` is called (from a lane thread) as each verdict arrives."""
    if not pairs:
        return []
    return run_jobs([Job(task, cand) for task, cand in pairs], config, plan=plan, on_result=_each(on_result))


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


def time_baselines(items: list[tuple[Task, str]], config: EvalConfig, *, plan: DevicePlan | None = None,
                   on_result: Callable[[EvalResult], None] | None = None,
                   on_stats: Callable[[BatchStats], None] | None = None) -> list[EvalResult]:
    """Time each (task, mode): the task's reference wrapped by ``mode`` (``torch.compile`` modes,
    CUDA-graph replay) against the eager reference.  Results in input order."""
    from cudal1.harness.baselines import check_modes

    plan = plan or DevicePlan.detect(config.device)
    check_modes(sorted({mode for _, mode in items}), plan.device)
    if not items:
        return []
    return run_jobs([Job(task, None, mode) for task, mode in items], config, plan=plan, on_result=_each(on_result),
                    on_stats=on_stats)


def measure_baselines(tasks: list[Task], modes: list[str], config: EvalConfig, *, plan: DevicePlan | None = None,
                      on_result: Callable[[EvalResult], None] | None = None) -> dict[tuple[str, str], EvalResult]:
    """Every task under every mode; returns {(task hash, mode): result}."""
    from cudal1.harness.baselines import check_modes

    plan = plan or DevicePlan.detect(config.device)
    modes = check_modes(modes, plan.device)
    items = [(task, mode) for task in tasks for mode in modes]
    results = time_baselines(items, config, plan=plan, on_result=on_result)
    return {(task.hash, mode): res for (task, mode), res in zip(items, results)}
