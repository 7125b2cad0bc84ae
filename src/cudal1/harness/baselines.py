"""Baseline wrappers: the reference itself under ``torch.compile`` modes or CUDA-graph replay.

Each mode is timed with the same timer and protocol as candidates (the worker's ``baseline``
mode), so a baseline speedup is directly comparable with a candidate speedup.  Registry:
``MODES``; an unknown mode is an error.  Mode names are the shared vocabulary of
:mod:`cudal1.compile_modes` (the builtin policy's exec passes use the same names, the same
``torch.compile`` modes and the same :class:`~cudal1.cuda_graph.CudaGraphReplay`); the names
used before it (``compile``, ``compile-ro``, ``max-autotune``) are accepted and resolved.
"""

from __future__ import annotations

from typing import Any

import torch

from cudal1.compile_modes import COMPILE_MODES, CUDA_GRAPH, CUDA_GRAPH_DESCRIPTION, EAGER, canonical
from cudal1.cuda_graph import CudaGraphReplay

MODES: dict[str, str] = {
    EAGER: "the reference as written",
    **{name: m.description for name, m in COMPILE_MODES.items()},
    CUDA_GRAPH: f"the reference's forward: {CUDA_GRAPH_DESCRIPTION}, replayed",
}


def check_modes(modes: list[str], device: str) -> list[str]:
    """Mode names resolved to the vocabulary (fail loudly on an unknown one); modes that need
    CUDA (``cudagraph``, ``compile-reduce-overhead``) are dropped on CPU."""
    resolved = [(m, canonical_mode(m)) for m in modes]
    unknown = [m for m, r in resolved if r is None]
    if unknown:
        raise ValueError(f"unknown baseline mode(s): {', '.join(unknown)}; known: {', '.join(MODES)}")
    return [r for _, r in resolved if not (device == "cpu" and _cuda_only(r))]  # type: ignore[arg-type]


def canonical_mode(mode: str) -> str | None:
    """``mode`` as named in ``MODES`` (old baseline names resolved), or None when unknown."""
    try:
        return canonical(mode, tuple(MODES))
    except ValueError:
        return None


def _cuda_only(mode: str) -> bool:
    return mode == CUDA_GRAPH or (mode in COMPILE_MODES and COMPILE_MODES[mode].cuda_only)


class GraphedModel(torch.nn.Module):
    """``model`` behind :class:`CudaGraphReplay` without output copies: replay alone is timed, and
    the returned tensors are the graph's static outputs (overwritten by the next call)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.replay = CudaGraphReplay(model, clone_outputs=False)

    def forward(self, *args: Any) -> Any:
        return self.replay(*args)


def wrap_baseline(mode: str, model: torch.nn.Module, device: torch.device) -> Any:
    mode = canonical(mode, tuple(MODES))
    if mode == EAGER:
        return model
    if mode in COMPILE_MODES:
        return torch.compile(model, mode=COMPILE_MODES[mode].torch_mode)  # None: torch's default mode
    if device.type != "cuda":
        raise ValueError("cudagraph baseline needs CUDA")
    return GraphedModel(model)
