"""Degenerate-task detection from the reference's own outputs (run inside the worker).

A task is degenerate when its reference output is (near) zero, constant, or does not depend on
its inputs or on the init seed: any "optimization" of it can be a constant.  The worker keeps a
small fingerprint of each correctness trial's reference output (a fixed sample of elements) and
asks :func:`degenerate_reason` at the end.  Informational for the candidate's verdict (flag
``degenerate_task``); consumers must not count a speedup on such a task as an optimization.
"""

from __future__ import annotations

from typing import Any

import torch

_SAMPLE = 4096
_NEAR_ZERO = 1e-6


def fingerprint(out: Any) -> torch.Tensor | None:
    """Float64 CPU sample of the first float tensor of an output (fixed positions)."""
    from cudal1.harness.compare import leaves

    for _, leaf in leaves(out):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel():
            flat = leaf.detach().reshape(-1)
            step = max(1, flat.numel() // _SAMPLE)
            return flat[::step][:_SAMPLE].to(torch.float64).cpu()
    return None


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-30)
    return a.shape == b.shape and bool(((a - b).abs().max() <= 1e-6 * scale).item())


def degenerate_reason(prints: list[torch.Tensor], other_seed: torch.Tensor | None = None) -> str | None:
    """Why the task looks degenerate, or None.  ``prints``: one fingerprint per trial (fresh
    inputs each); ``other_seed``: trial 0's fingerprint from a model built with another init
    seed (pass it only for models that have floating-point parameters)."""
    prints = [p for p in prints if p is not None]
    if not prints:
        return None
    finite = [p[torch.isfinite(p)] for p in prints]
    if all(f.numel() == 0 for f in finite):
        return "reference output is all NaN/Inf"
    if all(f.numel() == 0 or float(f.abs().max()) < _NEAR_ZERO for f in finite):
        return "reference output is (near) zero"
    if (
        all(f.numel() > 1 and float(f.max() - f.min()) <= 1e-7 * max(float(f.abs().max()), 1e-30) for f in finite)
        and len(prints) > 1
        and all(_close(prints[0], p) for p in prints[1:])
    ):
        return "reference output is one constant"
    if len(prints) > 1 and all(_close(prints[0], p) for p in prints[1:]):
        return "reference output does not depend on the inputs"
    if other_seed is not None and _close(prints[0], other_seed):
        return "reference output does not depend on its parameters' initialisation"
    return None
