"""cudal1's judge: isolated, hack-resistant evaluation of candidate kernels.

Front door: :func:`evaluate` (one task, many candidates) and :func:`evaluate_pairs` (many tasks);
:func:`measure_baselines` for eager / ``torch.compile`` / CUDA-graph baselines.  The harness knows
nothing of prompts, policies, RL or run stores (resume and recording are :mod:`cudal1.runs`).

What in-process isolation cannot prevent (stated honestly): the candidate and the reference run
in the same worker process, so candidate code can in principle read the worker's memory — the
channel key, the secret input seed, the reference model — and patch Python objects the judge
did not capture in advance.  The judge makes this costly and detectable (fresh inputs on every
timed call, re-checks, captured callables, signed verdicts, per-candidate processes), not
impossible.  Native code can do anything the process can.  Run untrusted candidates on machines
you can afford to lose, under an OS sandbox if they may be hostile.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BASELINE_MODES", "DevicePlan", "HarnessError", "Job", "evaluate", "evaluate_pairs", "measure_baselines", "run_jobs",
           "time_baselines"]


def __getattr__(name: str) -> Any:
    """The front door, imported on first use: ``import cudal1.harness.launcher`` (the CLI's first
    step) must not pull in torch."""
    if name == "BASELINE_MODES":
        from cudal1.harness.baselines import MODES

        return MODES
    if name in __all__:
        from cudal1.harness import api

        return getattr(api, name)
    raise AttributeError(f"module 'cudal1.harness' has no attribute {name!r}")
