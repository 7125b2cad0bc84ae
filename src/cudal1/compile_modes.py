"""One vocabulary for how a model's forward is executed: ``torch.compile`` modes and CUDA-graph
replay, shared by the judge's baselines (``cudal1.harness.baselines``) and the builtin policy's
exec passes (``cudal1.policy.builtin``), so ``compile-max-autotune`` means the same thing in a
baseline table and in a candidate's pass chain.

Contract: :data:`COMPILE_MODES` maps each name to the ``torch.compile`` mode it runs (registry
order is the builtin policy's proposal order among them); :data:`CUDA_GRAPH` names whole-forward
CUDA-graph replay (:class:`cudal1.cuda_graph.CudaGraphReplay`); :func:`canonical` resolves a
name (and the baseline names used before this vocabulary: ``compile``, ``compile-ro``,
``max-autotune``) or raises ``ValueError`` naming the known ones.

Beyond the modes, the builtin policy searches Inductor's own settings per task:
:data:`INDUCTOR_SETTINGS` names each setting (its ``torch.compile(options=...)`` entries and when
it can matter), and a set of them is the exec pass ``inductor[a,b]`` (:func:`inductor_name`,
:func:`inductor_settings`); :data:`COMPILE_CUDAGRAPH` is a compiled forward captured whole in one
CUDA graph.  These are candidates only, not baselines.  This module imports nothing heavy (no
torch): policies and the CLI read it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
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
# Each graphed mode's compile without CUDA graphs: the same Inductor compile (its autotuning too),
# then captured; a task's baselines that share one compile cache reuse the twin's work.
UNGRAPHED_TWIN = {"compile-reduce-overhead": "compile-default",
                  "compile-max-autotune": "compile-max-autotune-no-cudagraphs"}
CUDA_GRAPH = "cudagraph"  # whole-forward CUDA-graph capture with static buffers (cuda_graph.CudaGraphReplay)
CUDA_GRAPH_DESCRIPTION = "whole-forward CUDA-graph capture with static buffers"
EAGER = "eager"  # the model as written (baselines only)

# Baseline names from before this vocabulary; accepted so old commands and stored runs still read.
ALIASES = {"compile": "compile-default", "compile-ro": "compile-reduce-overhead",
           "max-autotune": "compile-max-autotune"}




@dataclass(frozen=True)
class InductorSetting:
    name: str  # its key inside an ``inductor[...]`` pass name
    options: dict[str, object] = field(hash=False)  # torch.compile(options=...) entries
    description: str  # one line for candidate headers
    needs: str = ""  # "" always worth trying | "params": the model has weights | "gemm": matmuls or convolutions


# Registry order is the order the search tries them.  Settings Inductor already has on by default
# (epilogue fusion, shape padding where its heuristic expects a gain) are not listed; "padding"
# forces the padding everywhere and "gemm" benchmarks the epilogue choices with every GEMM back end.
INDUCTOR_SETTINGS: dict[str, InductorSetting] = {
    s.name: s
    for s in (
        InductorSetting("cd", {"coordinate_descent_tuning": True}, "coordinate-descent tuning of each Triton kernel's "
                        "launch configuration"),
        InductorSetting("gemm", {"max_autotune_gemm": True, "max_autotune_gemm_backends": "GEMM_BACKENDS",
                                 "benchmark_epilogue_fusion": True},
                        "GEMM/convolution templates autotuned over every back end present (cuBLAS(Lt), Triton, "
                        "CUTLASS when installed), epilogue fusion benchmarked", "gemm"),
        InductorSetting("freezing", {"freezing": True}, "weights frozen into the compiled graph as constants "
                        "(constant folding, layout chosen once; inference only)", "params"),
        InductorSetting("padding", {"force_shape_pad": True}, "every GEMM's dimensions padded to aligned sizes",
                        "gemm"),
        InductorSetting("aggressive", {"aggressive_fusion": True}, "fuse nodes even without shared memory reads"),
    )
}
COMPILE_CUDAGRAPH = "compile-cudagraph"  # torch.compile (default mode) inside one whole-forward CUDA graph
COMPILE_CUDAGRAPH_DESCRIPTION = "torch.compile default mode, the compiled forward captured whole in one CUDA graph"
_INDUCTOR_RE = re.compile(r"inductor\[([a-z,]*)\]")


def inductor_name(settings: set[str] | list[str] | tuple[str, ...]) -> str:
    """The exec pass name of a set of settings, in registry order: ``inductor[cd,freezing]``."""
    unknown = set(settings) - set(INDUCTOR_SETTINGS)
    if unknown:
        raise ValueError(
            f"unknown inductor setting(s) {', '.join(sorted(unknown))}; known: {', '.join(INDUCTOR_SETTINGS)}"
        )
    return "inductor[" + ",".join(n for n in INDUCTOR_SETTINGS if n in settings) + "]"


def inductor_settings(name: str) -> tuple[str, ...] | None:
    """The settings of an ``inductor[...]`` pass name (registry order), or None for any other name;
    ValueError for an unknown, repeated or empty setting list."""
    m = _INDUCTOR_RE.fullmatch(name)
    if m is None:
        return None
    parts = tuple(m.group(1).split(",")) if m.group(1) else ()
    if not parts or len(set(parts)) != len(parts) or inductor_name(parts) != name:
        raise ValueError(f"bad inductor pass {name!r}: settings are a non-empty list in the order "
                         f"{', '.join(INDUCTOR_SETTINGS)}")
    return parts


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
