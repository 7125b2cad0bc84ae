"""One vocabulary for how a model's forward is executed: ``torch.compile`` modes and CUDA-graph
replay, shared by the judge's baselines (``cudal1.harness.baselines``) and the builtin policy's
exec passes (``cudal1.policy.builtin``), so ``compile-max-autotune`` means the same thing in a
baseline table and in a candidate's pass chain.

Contract: :data:`COMPILE_MODES` maps each name to the ``torch.compile`` mode it runs (registry
order is the builtin policy's proposal order among them); :data:`CUDA_GRAPH` names whole-forward
CUDA-graph replay (:class:`cudal1.cuda_graph.CudaGraphReplay`); :func:`canonical` resolves a
name (and the baseline names used before this vocabulary: ``compile``, ``compile-ro``,
``max-autotune``) or raises ``ValueError`` naming the known ones.  This module imports nothing
heavy (no torch): policies and the CLI read it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CompileMode:
    name: str  # the name in baselines, pass chains and reports
    torch_mode: str | None  # torch.compile(mode=...); None = torch's default mode
    description: str  # one line for tables and candidate headers
    cuda_only: bool  # only meaningful on a CUDA device (uses CUDA graphs)


COMPILE_MODES: dict[str, CompileMode] = {
    m.name: m
    for m in (
        CompileMode("compile-default", None, "torch.compile, default mode (Inductor fusion)", False),
        CompileMode("compile-max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs",
                    "torch.compile, max-autotune without CUDA graphs", False),
        CompileMode("compile-reduce-overhead", "reduce-overhead", "torch.compile, reduce-overhead (CUDA graphs)", True),
        CompileMode("compile-max-autotune", "max-autotune",
                    "torch.compile, max-autotune (autotuned Triton/GEMM templates, CUDA graphs)", False),
    )
}
CUDA_GRAPH = "cudagraph"  # whole-forward CUDA-graph capture with static buffers (cuda_graph.CudaGraphReplay)
CUDA_GRAPH_DESCRIPTION = "whole-forward CUDA-graph capture with static buffers"
EAGER = "eager"  # the model as written (baselines only)

# Baseline names from before this vocabulary; accepted so old commands and stored runs still read.
ALIASES = {"compile": "compile-default", "compile-ro": "compile-reduce-overhead",
           "max-autotune": "compile-max-autotune"}


def canonical(name: str, known: tuple[str, ...] | None = None) -> str:
    """``name`` in this vocabulary (aliases resolved); ValueError for a name outside ``known``
    (default: eager, every compile mode and cudagraph)."""
    known = known if known is not None else (EAGER, *COMPILE_MODES, CUDA_GRAPH)
    resolved = ALIASES.get(name, name)
    if resolved not in known:
        raise ValueError(f"unknown mode {name!r}; known: {', '.join(known)}")
    return resolved


def cuda_graph_source() -> str:
    """The source of :class:`cudal1.cuda_graph.CudaGraphReplay`, read from its file (torch is not
    imported): what a builtin candidate embeds, since candidates import nothing from cudal1."""
    path = Path(__file__).with_name("cuda_graph.py")
    text = path.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == "CudaGraphReplay":
            return ast.get_source_segment(text, node) + "\n"
    raise RuntimeError(f"{path} defines no CudaGraphReplay")  # a packaging error, not a user error
