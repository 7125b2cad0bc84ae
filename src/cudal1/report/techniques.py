"""Technique labels for a candidate program, from static features only (nothing is run).

Contract: :func:`analyze` labels a candidate's source with techniques from the fixed vocabulary
:data:`TECHNIQUES` (CUDA-L1's eight families, then six about *how* the code runs) and gives, per
label, the source lines that triggered it (stripped, as they appear in the file; at most
:data:`MAX_EVIDENCE` per label).  Features used:

* the Python AST: calls (``torch.compile``, ``torch.cuda.CUDAGraph``, ``load_inline``, fused
  library entry points), ``@triton.jit`` / ``@triton.autotune`` functions and what their bodies
  compute (``tl.*`` calls, arithmetic on loaded values);
* the CUDA C++ inside string constants (``__global__``, ``__shared__``, ``__shfl_*_sync``,
  vector types, launch bounds, streams, cuBLAS/cuDNN/CUTLASS);
* with a ``reference``: the PyTorch operations of the two programs (code identical to the
  reference's is not counted as the candidate's own); an operation of the reference that the
  candidate no longer performs, without a custom kernel to take it over, is an algebraic shortcut,
  and so is a chain of matrix products nested the other way (``(A @ B) @ X`` → ``A @ (B @ X)``);
  the reference only adds labels to what the candidate's code shows on its own;
* the model's Performance Analysis, when given: it can add ``algebraic_shortcut`` or
  ``operation_fusion`` (evidence lines are then prefixed ``analysis:``).

Comments are never read: a candidate is labelled by what its code does, not by what it says.

Limits: these are heuristics over text and syntax.  Code that is never called still counts; an
algebraic rewrite that keeps the same operations and nesting (a folded weight computed once) is
seen only through the operations it drops or the analysis; fusion in CUDA C++ is recognised from
two or more distinct math operations in the device functions of one source block.  Evidence
lines prefixed ``reference:`` come from the reference.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from cudal1.report.reference_diff import FUSED_CALLS, dotted, op_name, parse_source, reference_of, reference_rules, walk

TECHNIQUES: tuple[str, ...] = (
    "memory_layout", "memory_coalescing", "operation_fusion", "algebraic_shortcut", "block_config",
    "warp_reduction", "smem_register_caching", "async_execution",
    "torch_compile", "cuda_graph", "library_call", "cuda_kernel", "triton_kernel", "pytorch_rewrite",
)
MAX_EVIDENCE = 5

# CUDA C++ line patterns (matched inside string constants holding CUDA source)
_CUDA_RULES: dict[str, tuple[str, ...]] = {
    "cuda_kernel": (r"__global__",),
    "memory_coalescing": (
        r"\b(float4|float2|double2|int4|half2|__half2|__nv_bfloat162)\b",
        r"blockDim\.x\s*\*\s*gridDim\.x|gridDim\.x\s*\*\s*blockDim\.x",
    ),
    "smem_register_caching": (
        r"__shared__",
        r"__ldg\s*\(",
        r"__constant__",
        r"^\s*(?:float|double|half|__half|int|scalar_t|acc_t)\s+\w+\s*\[\s*\w+\s*\]\s*(?:;|=|\{)",
    ),
    "warp_reduction": (
        r"__shfl(?:_down|_up|_xor)?_sync", r"__reduce_\w+_sync", r"WarpReduce", r"cg::reduce",
        r"\bwarp_?reduce\w*", r"\bwarpReduce\w*",
    ),
    "block_config": (
        r"__launch_bounds__",
        r"#define\s+\w*(?:BLOCK|TILE|THREADS|WARPS)\w*",
        r"constexpr\s+(?:int|unsigned|size_t|auto)\s+\w*(?:BLOCK|TILE|THREADS|Block|Tile|Threads)\w*",
        r"\bdim3\s+\w+\s*\(",
    ),
    "async_execution": (
        r"cudaStreamCreate\w*|cudaMemcpyAsync|cudaEventCreate|cp\.async|__pipeline_memcpy_async|memcpy_async",
    ),
    "memory_layout": (r"__shared__[^;]*\[\s*\w+\s*\+\s*1\s*\]",),  # padding against bank conflicts
    "library_call": (r"\b(?:cublas\w*|cudnn\w*|cusparse\w*|cufft\w*)\b|cutlass::|cub::|thrust::",),
    "cuda_graph": (r"cudaGraph\w*|cudaStreamBeginCapture",),
}
# math operations whose co-occurrence in one kernel source marks a fused kernel
_CUDA_MATH: dict[str, str] = {
    "exp": r"\b(?:__)?expf?\s*\(|\bexp2f?\s*\(", "log": r"\b(?:__)?logf?\s*\(", "tanh": r"\btanhf?\s*\(",
    "erf": r"\berff?\s*\(", "sqrt": r"\br?sqrtf?\s*\(", "pow": r"\b(?:__)?powf?\s*\(",
    "max_min": r"\bf?(?:max|min)f?\s*\(", "accumulate": r"\+=", "divide": r"\b__fdividef\s*\(|/\s*\(",
}
# the same for Triton kernel bodies: tl.<name> -> category
_TL_MATH: dict[str, str] = {
    "exp": "exp", "exp2": "exp", "log": "log", "log2": "log", "sqrt": "sqrt", "rsqrt": "sqrt", "sigmoid": "sigmoid",
    "tanh": "tanh", "erf": "erf", "maximum": "max_min", "minimum": "max_min", "where": "select", "sum": "reduce",
    "max": "reduce", "min": "reduce", "reduce": "reduce", "dot": "dot", "abs": "abs", "softmax": "softmax",
    "cumsum": "scan", "clamp": "max_min", "fma": "arith",
}
_TL_REDUCE = {"sum", "max", "min", "reduce", "argmax", "argmin", "xor_sum"}
# vendor-library-backed or fused torch entry points
_LIBRARY_CALLS = {"addmm", "baddbmm", "addbmm", "addmv", "addr", "scaled_dot_product_attention", "cdist",
                  "addcmul", "addcdiv", "linear", "mm", "bmm", "matmul", "einsum", "conv1d", "conv2d", "conv3d",
                  "conv_transpose2d", "layer_norm", "batch_norm", "group_norm"}
_ANALYSIS_RULES = {
    "algebraic_shortcut": r"algebraic|mathematical(?:ly)? (?:identity|equivalen)|associativ|closed[- ]form|"
    r"re-?parenthes|simplif(?:y|ies|ied|ication) the (?:math|computation|expression)|fold(?:s|ed|ing)? the",
    "operation_fusion": r"\bfus(?:e|es|ed|ing|ion)\b",
}


@dataclass
class Techniques:
    """Labels of one program, in vocabulary order, with the lines that triggered each."""

    techniques: list[str] = field(default_factory=list)
    evidence: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"techniques": list(self.techniques), "evidence": {k: list(v) for k, v in self.evidence.items()}}


class _Evidence:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.found: dict[str, list[str]] = {}

    def add(self, tech: str, line: int | str) -> None:
        text = (self.lines[line - 1] if 0 < line <= len(self.lines) else "") if isinstance(line, int) else line
        text = text.strip()
        got = self.found.setdefault(tech, [])
        if text and text not in got and len(got) < MAX_EVIDENCE:
            got.append(text)
        elif not text and not got:
            got.append(tech)

    def result(self) -> Techniques:
        techs = [t for t in TECHNIQUES if t in self.found]
        return Techniques(techs, {t: self.found[t] for t in techs})


# ---- AST features -----------------------------------------------------------------------------


def _cuda_blocks(tree: ast.Module | None, source: str) -> list[tuple[int, int]]:
    """Line ranges (1-based, inclusive) of string constants holding CUDA C++."""
    if tree is None:
        return [(1, len(source.splitlines()))] if "__global__" in source else []
    out = []
    for node in walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(
                r"__global__|__device__|#include|cudaStream|__shared__", node.value):
            out.append((node.lineno, node.end_lineno or node.lineno))
    return out


def _triton_functions(tree: ast.Module | None) -> list[ast.FunctionDef]:
    if tree is None:
        return []
    from_triton = any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("triton") for n in walk(tree))
    out = []
    for node in walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                name = dotted(dec.func if isinstance(dec, ast.Call) else dec)
                if name.startswith("triton.") or (name in ("jit", "autotune", "heuristics") and from_triton):
                    out.append(node)
                    break
    return out


# ---- rules ------------------------------------------------------------------------------------


def _device_lines(lines: list[str], lo: int, hi: int) -> set[int]:
    """Line numbers inside ``__global__``/``__device__`` function bodies (brace counting; host
    code such as launch-size arithmetic is left out)."""
    inside: set[int] = set()
    depth, active = 0, False
    for n in range(lo, hi + 1):
        line = lines[n - 1] if n <= len(lines) else ""
        if not active and re.search(r"__global__|__device__", line) and "(" in line:
            active, depth = True, 0
        if active:
            inside.add(n)
            depth += line.count("{") - line.count("}")
            if depth <= 0 and "}" in line:
                active = False
    return inside


def _cuda_rules(ev: _Evidence, blocks: list[tuple[int, int]]) -> None:
    for lo, hi in blocks:
        cats: dict[str, int] = {}
        device = _device_lines(ev.lines, lo, hi)
        for n in range(lo, hi + 1):
            line = ev.lines[n - 1] if n <= len(ev.lines) else ""
            for tech, pats in _CUDA_RULES.items():
                if any(re.search(p, line) for p in pats):
                    ev.add(tech, n)
            if n in device:
                for cat, pat in _CUDA_MATH.items():
                    if re.search(pat, line):
                        cats.setdefault(cat, n)
        if len(cats) >= 2:  # two kinds of math in device code: a fused kernel
            for n in sorted(set(cats.values())):
                ev.add("operation_fusion", n)


def _triton_rules(ev: _Evidence, funcs: list[ast.FunctionDef]) -> None:
    for fn in funcs:
        ev.add("triton_kernel", fn.lineno)
        for dec in fn.decorator_list:
            name = dotted(dec.func if isinstance(dec, ast.Call) else dec)
            if name.endswith("autotune") or name.endswith("heuristics"):
                ev.add("block_config", dec.lineno)
        loaded: set[str] = set()
        cats: dict[str, int] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.arg) and node.annotation is not None and "constexpr" in dotted(node.annotation) \
                    and re.search(r"BLOCK|TILE|GROUP|WARPS", node.arg, re.I):
                ev.add("block_config", node.lineno)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and op_name(node.value) == "load":
                loaded.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(fn):  # values derived from loads, in source order (one pass is enough for straight code)
            if isinstance(node, ast.Assign) and any(
                isinstance(n, ast.Name) and n.id in loaded for n in ast.walk(node.value)
            ):
                loaded.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                name = dotted(node.func)
                short = name.rsplit(".", 1)[-1]
                if (
                    name.startswith(("tl.", "triton.language.", "libdevice.", "tl.math.", "tl.extra"))
                    and short in _TL_MATH
                ):
                    cats.setdefault(_TL_MATH[short], node.lineno)
                    if short in _TL_REDUCE:
                        ev.add("warp_reduction", node.lineno)
                if short in ("make_block_ptr", "max_contiguous", "multiple_of"):
                    ev.add("memory_coalescing", node.lineno)
                if short == "range" and any(k.arg == "num_stages" for k in node.keywords):
                    ev.add("async_execution", node.lineno)
                if short == "Config" or any(k.arg in ("num_warps", "num_stages") for k in node.keywords):
                    ev.add("block_config", node.lineno)
            elif isinstance(node, ast.BinOp) and not isinstance(node.op, ast.MatMult) and any(
                    isinstance(n, ast.Name) and n.id in loaded for n in ast.walk(node)):
                cats.setdefault("arith", node.lineno)
        if len(cats) >= 2:
            for n in sorted(set(cats.values())):
                ev.add("operation_fusion", n)


def _python_rules(ev: _Evidence, tree: ast.Module | None, ref_calls: set[str]) -> None:
    if tree is None:
        return
    for node in walk(tree):
        if isinstance(node, ast.Call):
            name, short = dotted(node.func), op_name(node)
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            if name in ("torch.compile", "torch._dynamo.optimize") or name.endswith("._dynamo.optimize"):
                ev.add("torch_compile", node.lineno)
                mode = kw.get("mode")
                if isinstance(mode, ast.Constant) and mode.value in ("reduce-overhead", "max-autotune"):
                    ev.add("cuda_graph", node.lineno)
            elif short in ("CUDAGraph", "make_graphed_callables") or name in ("torch.cuda.graph",) or short == "replay":
                ev.add("cuda_graph", node.lineno)
            elif short in ("load_inline", "RawKernel", "RawModule") or name.endswith("cpp_extension.load"):
                ev.add("cuda_kernel", node.lineno)
            elif short in ("Stream",) and "cuda" in name or name in ("torch.cuda.stream",):
                ev.add("async_execution", node.lineno)
            if isinstance(kw.get("non_blocking"), ast.Constant) and kw["non_blocking"].value is True:
                ev.add("async_execution", node.lineno)
            if "memory_format" in kw or short in ("as_strided",):
                ev.add("memory_layout", node.lineno)
            if short in FUSED_CALLS and short not in ref_calls:
                ev.add("operation_fusion", node.lineno)
            if short in FUSED_CALLS or (ref_calls and short in _LIBRARY_CALLS and short not in ref_calls):
                ev.add("library_call", node.lineno)
        elif isinstance(node, ast.Attribute):
            if node.attr in ("channels_last", "channels_last_3d"):
                ev.add("memory_layout", node.lineno)
            elif (
                node.attr == "benchmark"
                and isinstance(node.ctx, ast.Store)
                and dotted(node).endswith("cudnn.benchmark")
            ):
                ev.add("library_call", node.lineno)
    for n, line in enumerate(ev.lines, 1):
        if (
            re.search(r"\.(?:t|transpose\([^)]*\)|permute\([^)]*\))\(?\)?\.contiguous\(\)", line)
            and "__global__" not in line
        ):
            ev.add("memory_layout", n)


def _analysis_rules(ev: _Evidence, analysis: str) -> None:
    for tech, pat in _ANALYSIS_RULES.items():
        for sentence in re.split(r"(?<=[.!?])\s+|\n", analysis):
            if re.search(pat, sentence, re.I):
                ev.add(tech, "analysis: " + sentence.strip()[:200])
                break


def analyze(source: str, reference: str | None = None, analysis: str = "") -> Techniques:
    """Label ``source`` (a candidate module) with techniques; see the module docstring."""
    lines = source.splitlines()
    ev = _Evidence(lines)
    tree = parse_source(source)
    _cuda_rules(ev, _cuda_blocks(tree, source))
    _triton_rules(ev, _triton_functions(tree))
    ref = reference_of(reference) if reference else None
    ref_calls = set(ref.ops) if ref else set()
    _python_rules(ev, tree, ref_calls)
    custom = "cuda_kernel" in ev.found or "triton_kernel" in ev.found
    if not custom and tree is not None and "torch_compile" not in ev.found and "cuda_graph" not in ev.found:
        _standalone_rewrite(ev, tree)
    if reference:  # only adds labels: what the code shows on its own stays
        reference_rules(ev, tree, reference, custom)
    if analysis:
        _analysis_rules(ev, analysis)
    return ev.result()


def _standalone_rewrite(ev: _Evidence, tree: ast.Module) -> None:
    """Without a reference: a ModelNew with its own forward built from PyTorch operations."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "forward":
                    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) or
                             (isinstance(c, ast.BinOp) and isinstance(c.op, ast.MatMult))]
                    for c in calls[:MAX_EVIDENCE]:
                        ev.add("pytorch_rewrite", c.lineno)
