"""The builtin policy's passes: the registry ``PASSES`` and how each renders its ``ModelNew`` stage.

Contract: a :class:`Pass` renders, from the task source and the name of the class to build on
(``Model`` or an earlier stage ``_StageN``), the source of one ``class ModelNew(<base>)`` (plus any
module-level helpers it needs), or None when it declines the task.  Kinds:

- ``graph`` passes rewrite the traced reference (:mod:`cudal1.rewrite`, in a child process) and
  apply to the reference itself only.  Each is a :class:`GraphVariant`: the rewrites it runs
  and the one that must have applied for the candidate to exist (``algebraic``: any).
- ``layout`` passes (channels_last, scoped cuDNN autotuning) may stack under one ``exec`` pass.
- ``exec`` passes (``torch.compile`` modes, CUDA-graph capture, a compiled forward inside one CUDA
  graph, and ``inductor[...]``: ``torch.compile`` with a set of Inductor settings from
  :data:`cudal1.compile_modes.INDUCTOR_SETTINGS`) come last, at most one per chain.

:func:`pass_named` resolves a name, including any ``inductor[...]`` set (the registry lists the
single settings).  Generated sources import nothing from cudal1.
"""

from __future__ import annotations

import hashlib
import os
import re
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cudal1.compile_modes import (
    COMPILE_CUDAGRAPH,
    COMPILE_CUDAGRAPH_DESCRIPTION,
    COMPILE_MODES,
    CUDA_GRAPH,
    CUDA_GRAPH_DESCRIPTION,
    INDUCTOR_SETTINGS,
    CompileMode,
    cuda_graph_source,
    inductor_name,
    inductor_settings,
)


@dataclass(frozen=True)
class Pass:
    name: str
    description: str
    kind: str  # graph | layout | exec
    cuda_only: bool
    render: Callable[[str, str], str | None]  # (task source, base class name) -> ModelNew class source, None = declines


# ---- exec passes (names, torch.compile modes and the CUDA-graph wrapper: cudal1.compile_modes) -----

def _compiled_class(base: str, doc: str, compile_call: str, prelude: str = "") -> str:
    return prelude + textwrap.dedent(f'''
        class ModelNew({base}):
            """{doc}"""

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self._compiled_forward = {compile_call}

            def forward(self, *args):
                return self._compiled_forward(*args)
        ''')


def _compile_class(mode: CompileMode) -> Callable[[str, str], str]:
    def render(_source: str, base: str) -> str:
        mode_arg = f', mode="{mode.torch_mode}"' if mode.torch_mode else ""
        label = mode.torch_mode or "default"
        return _compiled_class(base, f"The {base} forward compiled by torch.compile (mode {label}); same parameters.",
                               f"torch.compile(super().forward{mode_arg})")
    return render


def _cudagraph_class(_source: str, base: str) -> str:
    wrapper = cuda_graph_source()  # the judge's cudagraph baseline runs the same class
    return wrapper + "\n" + textwrap.dedent(f'''
        class ModelNew({base}):
            """The {base} forward captured in a CUDA graph and replayed (CudaGraphReplay above).

            Inputs are copied into static buffers on every call; outputs are cloned, so a caller
            never sees them change on the next call.  Falls back to eager for non-CUDA inputs;
            new input shapes are captured anew.
            """

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self._replay = CudaGraphReplay(super().forward)

            def forward(self, *args):
                return self._replay(*args)
        ''')


def _compile_cudagraph_class(_source: str, base: str) -> str:
    wrapper = cuda_graph_source()
    return wrapper + "\n" + textwrap.dedent(f'''
        class ModelNew({base}):
            """The {base} forward compiled by torch.compile (default mode), then captured whole in
            one CUDA graph (CudaGraphReplay above): one launch per call, and none of the compiled
            code's per-call Python (guards, argument handling).  The graph's warm-up calls compile;
            inputs are copied into static buffers, outputs cloned; non-CUDA inputs run the compiled
            forward directly."""

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self._replay = CudaGraphReplay(torch.compile(super().forward))

            def forward(self, *args):
                return self._replay(*args)
        ''')


_GEMM_BACKENDS = textwrap.dedent('''
    def _cudal1_gemm_backends():
        """Inductor's GEMM back ends to autotune over: cuBLAS (ATEN) and Triton templates always,
        CUTLASS when Inductor finds it installed."""
        import importlib.util
        import os

        import torch._inductor.config as inductor_config

        cutlass = os.path.isdir(str(getattr(inductor_config.cuda, "cutlass_dir", "") or "")) and \\
            importlib.util.find_spec("cutlass_library") is not None
        return "ATEN,TRITON" + (",CUTLASS" if cutlass else "")
    ''')

# When a setting can matter (static look at the task source; the judge has the last word).
_NEEDS = {
    "params": re.compile(r"\bnn\.(?:Linear|Bilinear|Conv\w*|BatchNorm\w*|LayerNorm|GroupNorm|InstanceNorm\w*|RMSNorm|"
                         r"Embedding\w*|LSTM|GRU|RNN|MultiheadAttention|Transformer\w*|PReLU)\b|\bParameter\(|"
                         r"register_buffer\("),
    "gemm": re.compile(r"@|\bmatmul\b|\bmm\b|\bbmm\b|\baddmm\b|\bbaddbmm\b|\beinsum\b|\blinear\b|\bLinear\b|"
                       r"\bBilinear\b|\bconv\w*\b|\bConv\w*\b|\bLSTM\b|\bGRU\b|\bRNN\b|\bMultiheadAttention\b"),
}


def _inductor_class(settings: tuple[str, ...]) -> Callable[[str, str], str | None]:
    def render(source: str, base: str) -> str | None:
        if any(s.needs and not _NEEDS[s.needs].search(source) for s in (INDUCTOR_SETTINGS[n] for n in settings)):
            return None
        options: dict[str, object] = {}
        for name in settings:
            options.update(INDUCTOR_SETTINGS[name].options)
        items = ", ".join(f'"{k}": ' + ("_cudal1_gemm_backends()" if v == "GEMM_BACKENDS" else repr(v))
                          for k, v in options.items())
        what = "; ".join(INDUCTOR_SETTINGS[n].description for n in settings)
        doc = (f"The {base} forward compiled by torch.compile (default mode) with Inductor settings scoped to "
               f"this compilation (nothing global changes): {what}.")
        prelude = _GEMM_BACKENDS if "GEMM_BACKENDS" in options.values() else ""
        return _compiled_class(base, doc, f"torch.compile(super().forward, options={{{items}}})", prelude)
    return render


def _exec_pass(name: str) -> Pass:
    if name == CUDA_GRAPH:
        return Pass(CUDA_GRAPH, CUDA_GRAPH_DESCRIPTION, "exec", True, _cudagraph_class)
    if name == COMPILE_CUDAGRAPH:
        return Pass(COMPILE_CUDAGRAPH, COMPILE_CUDAGRAPH_DESCRIPTION, "exec", True, _compile_cudagraph_class)
    settings = inductor_settings(name)
    if settings is not None:
        what = ", ".join(INDUCTOR_SETTINGS[s].name for s in settings)
        return Pass(name, f"torch.compile with Inductor settings {what}", "exec", True, _inductor_class(settings))
    mode = COMPILE_MODES[name]
    return Pass(name, mode.description, "exec", mode.cuda_only, _compile_class(mode))


# ---- layout passes --------------------------------------------------------------------------------

_CONV_RE = re.compile(r"\b(?:nn\.)?Conv(?:Transpose)?([123])d\b")


def _conv_dims(source: str) -> set[str]:
    return set(_CONV_RE.findall(source))


_VIEW_RE = re.compile(r"\.view\(")


def _channels_last_class(source: str, base: str) -> str | None:
    dims = _conv_dims(source)
    if not dims or not dims <= {"2", "3"} or len(dims) != 1:
        return None  # no convolution, 1-D ones, or a mix of 2-D and 3-D
    if _VIEW_RE.search(source):  # .view() of a channels-last activation (LeNet's flatten) raises
        return None
    fmt, rank = ("channels_last", 4) if dims == {"2"} else ("channels_last_3d", 5)
    return textwrap.dedent(f'''
        class ModelNew({base}):
            """{base} with {rank}-D weights and inputs in torch.{fmt} memory format (NHWC-style),
            the layout cuDNN's fastest convolution kernels use.  Values are unchanged."""

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                for p in list(self.parameters()) + list(self.buffers()):
                    if p.dim() == {rank}:
                        p.data = p.data.contiguous(memory_format=torch.{fmt})

            def forward(self, *args):
                args = [a.contiguous(memory_format=torch.{fmt})
                        if isinstance(a, torch.Tensor) and a.dim() == {rank} else a for a in args]
                return super().forward(*args)
        ''')


def _cudnn_autotune_class(source: str, base: str) -> str | None:
    if not _conv_dims(source):
        return None
    return textwrap.dedent(f'''
        class ModelNew({base}):
            """{base} with cuDNN autotuning (benchmark mode) switched on for this forward only.

            The switch is scoped: every other cuDNN setting (including TF32) keeps its current
            value, and the previous settings are restored when forward returns, so nothing else
            in the process (the reference included) runs differently."""

            def forward(self, *args):
                cudnn = torch.backends.cudnn
                with cudnn.flags(enabled=cudnn.enabled, benchmark=True, deterministic=cudnn.deterministic,
                                 allow_tf32=cudnn.allow_tf32):
                    return super().forward(*args)
        ''')


# ---- graph-based passes ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GraphVariant:
    """A graph-based pass of the policy: the rewrites it runs (:mod:`cudal1.rewrite`), in order,
    and the one that must have rewritten something for its candidate to exist (None: any)."""

    rewrites: tuple[str, ...]
    requires: str | None


def _variants() -> dict[str, GraphVariant]:
    from cudal1.rewrite import ALGEBRAIC_REWRITES as A

    return {"algebraic": GraphVariant(A, None),
            "triton-fusion": GraphVariant(A + ("triton-fusion",), "triton-fusion"),
            "gemm-3xtf32": GraphVariant(A + ("gemm-3xtf32",), "gemm-3xtf32"),
            "triton-reduce": GraphVariant(A + ("triton-reduce",), "triton-reduce")}


GRAPH_VARIANTS: dict[str, GraphVariant] = _variants()


class GraphRewrites:
    """Per-task cache of child-process graph rewrites: every variant of one task source is traced
    by one child (thread-safe); outcomes also persist in the rewrite cache on disk (``cache_dir``,
    default :func:`cudal1.rewrite.cache_root`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, str], object] = {}
        self.cache_dir: str | None = None

    def _key(self, source: str, variant: str) -> tuple[str, str, str]:
        return hashlib.sha256(source.encode()).hexdigest(), variant, str(self.cache_dir)

    def prepare(self, source: str, variants: list[str]) -> list[object]:
        from cudal1.rewrite import rewrite_variants

        with self._lock:
            todo = [v for v in variants if self._key(source, v) not in self._cache]
        if todo:
            outcomes = rewrite_variants(source, [GRAPH_VARIANTS[v].rewrites for v in todo],
                                        cache_dir=self.cache_dir)
            with self._lock:
                for v, o in zip(todo, outcomes):
                    self._cache[self._key(source, v)] = o
        with self._lock:
            return [self._cache[self._key(source, v)] for v in variants]

    def get(self, source: str, variant: str) -> object:
        return self.prepare(source, [variant])[0]


REWRITES = GraphRewrites()


def set_rewrite_cache(path: str | os.PathLike[str] | None) -> None:
    """Keep this process's graph rewrites in ``path`` (e.g. a run directory carried between
    machines) instead of the user cache; None restores the default."""
    REWRITES.cache_dir = str(Path(path)) if path else None


def prepare_rewrites(sources: list[str], workers: int | None = None, variants: list[str] | None = None) -> list[object]:
    """Trace ``sources`` in parallel child processes, one per source for all ``variants`` (default
    every graph pass); the outcomes of the first variant, one per source."""
    variants = variants or list(GRAPH_VARIANTS)
    with ThreadPoolExecutor(max(1, workers or (os.cpu_count() or 2) // 2)) as pool:
        return [o[0] for o in pool.map(lambda src: REWRITES.prepare(src, variants), sources)]


def _graph_class(variant: str) -> Callable[[str, str], str | None]:
    def render(source: str, base: str) -> str | None:
        if base != "Model":
            return None  # graph rewrites trace the reference itself
        outcome = REWRITES.get(source, variant)
        need = GRAPH_VARIANTS[variant].requires
        ok = outcome.ok and (need is None or need in outcome.applied)  # type: ignore[attr-defined]
        return outcome.class_source if ok else None  # type: ignore[attr-defined]
    return render


def rewrite_detail(source: str, variant: str = "algebraic") -> str:
    """One line on what a graph pass's rewrites did (or why they declined) for ``source``."""
    outcome = REWRITES.get(source, variant)
    if outcome.ok:  # type: ignore[attr-defined]
        return "; ".join(n for notes in outcome.notes.values() for n in notes)  # type: ignore[attr-defined]
    return outcome.error  # type: ignore[attr-defined]


def _graph_pass(name: str, description: str, cuda_only: bool) -> Pass:
    return Pass(name, description, "graph", cuda_only, _graph_class(name))


PASSES: dict[str, Pass] = {
    p.name: p
    for p in (
        _graph_pass("algebraic", "torch.fx algebraic rewrites (diag broadcast, matrix-chain order, linear folding, "
                    "reductions through linear maps, fused attention, BatchNorm folding in eval mode, "
                    "redundant-op removal)", False),
        _exec_pass("compile-default"),
        _graph_pass("gemm-3xtf32", "the algebraic rewrites, then fp32 matrix products and 2-D convolutions as "
                    "generated Triton kernels with split-precision (3xTF32) tensor-core math, accurate to fp32", True),
        _graph_pass("triton-fusion", "the algebraic rewrites, then elementwise chains (and a convolution's bias) fused "
                    "into generated Triton kernels", True),
        _graph_pass("triton-reduce", "the algebraic rewrites, then softmax, normalizations and reductions as "
                    "generated Triton kernels with autotuned block sizes", True),
        Pass("channels-last", "convolution weights and inputs in channels_last memory format", "layout", True,
             _channels_last_class),
        Pass("cudnn-autotune", "scoped cuDNN autotuning (benchmark mode for this forward only)", "layout", True,
             _cudnn_autotune_class),
        _exec_pass(CUDA_GRAPH),
        _exec_pass(COMPILE_CUDAGRAPH),
        *(_exec_pass(inductor_name([s])) for s in INDUCTOR_SETTINGS),
        _exec_pass("compile-max-autotune-no-cudagraphs"),
        _exec_pass("compile-reduce-overhead"),
        _exec_pass("compile-max-autotune"),
    )
}


def pass_named(name: str) -> Pass:
    """The pass ``name``: a registry entry or any ``inductor[...]`` set; KeyError when unknown."""
    if name in PASSES:
        return PASSES[name]
    try:
        if inductor_settings(name) is not None:
            return _exec_pass(name)
    except ValueError:
        pass
    raise KeyError(name)
