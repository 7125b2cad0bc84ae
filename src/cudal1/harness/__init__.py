"""cudal1's judge: isolated, hack-resistant evaluation of candidate kernels.

Front door: :func:`evaluate` (one task, many candidates) and :func:`evaluate_pairs` (many tasks);
:func:`measure_baselines` for eager / ``torch.compile`` / CUDA-graph baselines.  The harness knows
nothing of prompts, policies, RL or run stores (resume and recording are :mod:`cudal1.recorded`).

Trust boundary: every job runs in two processes.  A clean reference worker, which never
imports candidate code, holds the reference, the secret-seeded inputs, the float64 answers, the
comparison and the reference's timing; the candidate runs in its own confined, unprivileged process
and sees only what it is handed (init inputs, the weights' seed, per-call input copies).  The
parent computes the statistics from both processes' raw times and bounds the candidate's reports
by the clean side's clock and by physics.  docs/harness.md says what remains possible.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BASELINE_MODES", "DevicePlan", "HarnessError", "Job", "evaluate", "evaluate_pairs", "measure_baselines",
    "run_jobs", "time_baselines",
]


def __getattr__(name: str) -> Any:
    """The front door, imported on first use: ``import cudal1.harness.parent.launcher`` (the CLI's first
    step) must not pull in torch."""
    if name == "BASELINE_MODES":
        from cudal1.harness.baselines import MODES

        return MODES
    if name in __all__:
        from cudal1.harness.parent import api

        return getattr(api, name)
    raise AttributeError(f"module 'cudal1.harness' has no attribute {name!r}")
