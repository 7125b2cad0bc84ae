"""Triton code generation for the ``triton-fusion`` pass: which elementwise operations can be
lowered, their Triton expressions, and the kernel + launcher source for one region.

Contract: :func:`recognise` maps an fx node to an :class:`Op` (operation, tensor/number operands,
parameters) when the node is an elementwise operation in one of its ``torch.*``, ``F.*``, method
or ``nn.Module`` spellings *and* its arguments can be lowered; :func:`generate` turns a
:class:`Region` (nodes, full-size and broadcast inputs; found by
:func:`cudal1.rewrite.triton_kernels.fusion.find_regions`) into the source of one ``@triton.jit`` kernel
over the flattened output (masked tail, ``BLOCK`` as a constexpr, fp32 math, output stored in the
reference's dtype) and a launcher ``_cudal1_fused_<i>``.  Every formula is PyTorch's (GELU with
``erf``, softplus with its threshold, ELU/SELU/CELU, hardswish …); ``tanh`` uses the overflow-free
``(1 - e^-2|x|) / (1 + e^-2|x|)`` (absolute error ~1e-7; libdevice is not used so the kernels also
run in Triton's interpreter).  On the meta device the launcher only allocates its output.

Not here: choosing regions (``triton_fusion``) and deciding whether one is worth a kernel
(``triton_cost``).  Row reductions are not lowered.
"""

from __future__ import annotations

import linecache
import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from cudal1.rewrite.graph.patterns import is_inplace, module_of

BLOCK = 1024  # elements per program
DTYPES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}  # dtypes the kernels load and store, with sizes

HEADER = "import math\n\nimport torch\nimport triton\nimport triton.language as tl"

# @triton.jit helpers a kernel may call, by name.
HELPERS = {
    "_cudal1_tanh": '''@triton.jit
def _cudal1_tanh(x):
    """tanh(x) = sign(x) * (1 - e^(-2|x|)) / (1 + e^(-2|x|)), which cannot overflow."""
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0.0, -y, y)''',
    "_cudal1_log1p_exp": '''@triton.jit
def _cudal1_log1p_exp(x):
    """log(1 + e^x) without overflow: max(x, 0) + log(1 + e^(-|x|))."""
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))''',
}


# ---- recognising elementwise operations --------------------------------------------------------

_REQ = object()  # a required argument


@dataclass(frozen=True)
class _Spec:
    op: str  # canonical operation (a key of _LOWER)
    params: tuple[tuple[str, Any], ...]  # (name, default) after the input; _REQ when required
    tensor_params: tuple[str, ...] = ()  # parameters (besides the input) that may be tensors
    fixed: tuple[tuple[str, Any], ...] = ()  # values implied by the spelling (relu6 = hardtanh(0, 6))


def _spec(op: str, *params: tuple[str, Any], tensors: tuple[str, ...] = (), **fixed: Any) -> _Spec:
    return _Spec(op, tuple(params), tensors, tuple(fixed.items()))


_INPLACE = ("inplace", False)
_BINARY = (("other", _REQ),)

# callables (torch.*, F.*, operator.*) → spec
_FUNCTIONS: dict[Any, _Spec] = {}
for _fns, _s in [
    ((torch.relu, F.relu, torch.relu_), _spec("relu", _INPLACE)),
    ((F.relu6,), _spec("hardtanh", _INPLACE, min_val=0.0, max_val=6.0)),
    ((F.leaky_relu,), _spec("leaky_relu", ("negative_slope", 0.01), _INPLACE)),
    ((torch.sigmoid, F.sigmoid, torch.special.expit), _spec("sigmoid")),
    ((torch.tanh, F.tanh), _spec("tanh")),
    ((F.gelu,), _spec("gelu", ("approximate", "none"))),
    ((F.silu,), _spec("silu", _INPLACE)),
    ((F.mish,), _spec("mish", _INPLACE)),
    ((F.hardtanh,), _spec("hardtanh", ("min_val", -1.0), ("max_val", 1.0), _INPLACE)),
    ((torch.clamp, torch.clip), _spec("clamp", ("min", None), ("max", None))),
    ((torch.clamp_min,), _spec("clamp", ("min", _REQ))),
    ((torch.clamp_max,), _spec("clamp", ("max", _REQ))),
    ((F.hardswish,), _spec("hardswish", _INPLACE)),
    ((F.hardsigmoid,), _spec("hardsigmoid", _INPLACE)),
    ((F.softplus,), _spec("softplus", ("beta", 1.0), ("threshold", 20.0))),
    ((F.elu,), _spec("elu", ("alpha", 1.0), _INPLACE)),
    ((F.selu, torch.selu), _spec("selu", _INPLACE)),
    ((F.celu, torch.celu), _spec("celu", ("alpha", 1.0), _INPLACE)),
    ((F.softsign,), _spec("softsign")),
    ((F.logsigmoid,), _spec("logsigmoid")),
    ((F.tanhshrink,), _spec("tanhshrink")),
    ((F.threshold,), _spec("threshold", ("threshold", _REQ), ("value", _REQ), _INPLACE)),
    ((torch.exp,), _spec("exp")),
    ((torch.log,), _spec("log")),
    ((torch.abs, operator.abs), _spec("abs")),
    ((torch.neg, operator.neg), _spec("neg")),
    ((torch.sqrt,), _spec("sqrt")),
    ((torch.rsqrt,), _spec("rsqrt")),
    ((torch.reciprocal,), _spec("reciprocal")),
    ((torch.square,), _spec("square")),
    ((torch.erf, torch.special.erf), _spec("erf")),
    ((torch.pow, operator.pow), _spec("pow", ("exponent", _REQ))),
    ((operator.add, torch.add), _spec("add", *_BINARY, ("alpha", 1), tensors=("other",))),
    ((operator.sub, torch.sub, torch.subtract), _spec("sub", *_BINARY, ("alpha", 1), tensors=("other",))),
    ((operator.mul, torch.mul, torch.multiply), _spec("mul", *_BINARY, tensors=("other",))),
    ((operator.truediv, torch.div, torch.true_divide, torch.divide),
     _spec("div", *_BINARY, ("rounding_mode", None), tensors=("other",))),
    ((torch.maximum,), _spec("maximum", *_BINARY, tensors=("other",))),
    ((torch.minimum,), _spec("minimum", *_BINARY, tensors=("other",))),
    ((torch.max,), _spec("maximum", *_BINARY, tensors=("other",))),  # only the two-tensor form (checked)
    ((torch.min,), _spec("minimum", *_BINARY, tensors=("other",))),
]:
    for _f in _fns:
        _FUNCTIONS[_f] = _s

# tensor methods (x.relu(), x.clamp(min=0), x.add_(y) …) → spec
_METHODS: dict[str, _Spec] = {
    "relu": _spec("relu"), "sigmoid": _spec("sigmoid"), "tanh": _spec("tanh"),
    "clamp": _spec("clamp", ("min", None), ("max", None)), "clip": _spec("clamp", ("min", None), ("max", None)),
    "clamp_min": _spec("clamp", ("min", _REQ)), "clamp_max": _spec("clamp", ("max", _REQ)),
    "exp": _spec("exp"), "log": _spec("log"), "abs": _spec("abs"), "neg": _spec("neg"),
    "sqrt": _spec("sqrt"), "rsqrt": _spec("rsqrt"), "reciprocal": _spec("reciprocal"), "square": _spec("square"),
    "erf": _spec("erf"), "pow": _spec("pow", ("exponent", _REQ)),
    "add": _spec("add", *_BINARY, ("alpha", 1), tensors=("other",)),
    "sub": _spec("sub", *_BINARY, ("alpha", 1), tensors=("other",)),
    "mul": _spec("mul", *_BINARY, tensors=("other",)),
    "div": _spec("div", *_BINARY, ("rounding_mode", None), tensors=("other",)),
    "maximum": _spec("maximum", *_BINARY, tensors=("other",)),
    "minimum": _spec("minimum", *_BINARY, tensors=("other",)),
}
for _m in ("relu", "sigmoid", "tanh", "clamp", "clip", "clamp_min", "clamp_max", "exp", "log", "abs", "neg", "sqrt",
           "rsqrt", "reciprocal", "square", "erf", "pow", "add", "sub", "mul", "div"):
    _METHODS[_m + "_"] = _METHODS[_m]

# nn modules → (spec, {parameter: module attribute})
_MODULES: dict[type, tuple[str, dict[str, str]]] = {
    nn.ReLU: ("relu", {}), nn.ReLU6: ("hardtanh", {"min_val": "min_val", "max_val": "max_val"}),
    nn.LeakyReLU: ("leaky_relu", {"negative_slope": "negative_slope"}),
    nn.Sigmoid: ("sigmoid", {}), nn.Tanh: ("tanh", {}), nn.GELU: ("gelu", {"approximate": "approximate"}),
    nn.SiLU: ("silu", {}), nn.Mish: ("mish", {}),
    nn.Hardtanh: ("hardtanh", {"min_val": "min_val", "max_val": "max_val"}),
    nn.Hardswish: ("hardswish", {}), nn.Hardsigmoid: ("hardsigmoid", {}),
    nn.Softplus: ("softplus", {"beta": "beta", "threshold": "threshold"}),
    nn.ELU: ("elu", {"alpha": "alpha"}), nn.SELU: ("selu", {}), nn.CELU: ("celu", {"alpha": "alpha"}),
    nn.Softsign: ("softsign", {}), nn.LogSigmoid: ("logsigmoid", {}), nn.Tanhshrink: ("tanhshrink", {}),
    nn.Threshold: ("threshold", {"threshold": "threshold", "value": "value"}),
}


@dataclass
class Op:
    """One recognised elementwise node: its operation, tensor/number operands and parameters."""
    node: fx.Node
    op: str
    operands: list[Any]  # input first; fx.Node or Python number
    params: dict[str, Any] = field(default_factory=dict)
    inplace: bool = False  # overwrites its input (x.relu_(), inplace=True, nn.ReLU(inplace=True))

    def label(self) -> str:
        shown = {k: v for k, v in self.params.items() if v is not None and not (k == "alpha" and v == 1)}
        if self.op == "gelu" and shown.get("approximate") == "none":
            shown = {}
        if not shown:
            return self.op
        if self.op in ("clamp", "hardtanh"):
            bounds = (f"{k.removesuffix('_val')}={_fmt_param(v)}" for k, v in shown.items())
            return f"{self.op}({', '.join(bounds)})"
        return f"{self.op}({', '.join(_fmt_param(v) for v in shown.values())})"


def _fmt_param(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bind(node: fx.Node, spec: _Spec) -> dict[str, Any] | None:
    """Arguments of ``node`` by parameter name ("input" first: a method's ``self``), or None for an
    argument the spelling does not take."""
    names = ["input"] + [p for p, _ in spec.params]
    args = list(node.args)
    if len(args) > len(names):
        return None
    bound = dict(zip(names, args))
    for k, v in node.kwargs.items():
        if k not in names or k in bound:
            return None
        bound[k] = v
    for p, default in spec.params:
        if p not in bound:
            if default is _REQ:
                return None
            bound[p] = default
    bound.update(dict(spec.fixed))
    return bound


def recognise(node: fx.Node) -> Op | None:
    """The elementwise operation ``node`` performs, or None (not elementwise, or an unsupported form)."""
    if node.op == "call_function":
        try:
            spec = _FUNCTIONS.get(node.target)
        except TypeError:
            return None
        bound = _bind(node, spec) if spec else None
    elif node.op == "call_method":
        spec = _METHODS.get(str(node.target))
        bound = _bind(node, spec) if spec else None
    elif node.op == "call_module":
        mod = module_of(node)
        entry = _MODULES.get(type(mod))
        if entry is None or len(node.args) != 1 or node.kwargs:
            return None
        spec = _Spec(entry[0], ())
        bound = {"input": node.args[0], **{p: getattr(mod, a) for p, a in entry[1].items()}}
    else:
        return None
    if bound is None:
        return None
    inplace = bound.pop("inplace", False) is True or is_inplace(node)
    x = bound.pop("input")
    operands = [x]
    for p in spec.tensor_params:
        operands.append(bound.pop(p))
    if not any(isinstance(o, fx.Node) for o in operands):
        return None
    if not all(isinstance(o, fx.Node) or _number(o) for o in operands):
        return None
    op = Op(node, spec.op, operands, bound, inplace)
    return op if _lowerable(op) else None


def _lowerable(op: Op) -> bool:
    p = op.params
    numbers = {k: v for k, v in p.items() if k not in ("approximate", "rounding_mode")}
    if not all(v is None or _number(v) for v in numbers.values()):
        return False  # tensor or symbolic bounds/exponents are left to PyTorch
    if op.op in ("maximum", "minimum") and not all(isinstance(o, fx.Node) for o in op.operands):
        return False  # torch.max(x, dim) is a reduction; torch.maximum needs two tensors
    if op.op == "clamp" and (p.get("min") is None and p.get("max") is None):
        return False
    if op.op in ("clamp", "hardtanh"):
        lo, hi = p.get("min", p.get("min_val")), p.get("max", p.get("max_val"))
        if lo is not None and hi is not None and lo > hi:
            return False
    if op.op == "gelu" and p["approximate"] not in ("none", "tanh"):
        return False
    if op.op == "div" and p["rounding_mode"] is not None:
        return False
    if op.op == "softplus" and p["beta"] == 0:
        return False
    if op.op == "celu" and p["alpha"] == 0:
        return False
    if op.op == "pow" and (p["exponent"] not in _POWERS or not isinstance(op.operands[0], fx.Node)):
        return False
    return True


# ---- lowering to Triton expressions --------------------------------------------------------------

_POWERS = {1: "{x}", 2: "{x} * {x}", 3: "{x} * {x} * {x}", 4: "({x} * {x}) * ({x} * {x})", 0.5: "tl.sqrt_rn({x})",
           -0.5: "tl.rsqrt({x})", -1: "1.0 / {x}", -2: "1.0 / ({x} * {x})"}
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _lit(v: float) -> str:
    return repr(float(v))


def _lower(op: Op, a: list[str]) -> tuple[str, set[str]]:
    """(Triton expression, helpers it calls) for ``op`` on operand expressions ``a``."""
    x, p, o = a[0], op.params, op.op
    if o == "relu":
        return f"tl.where({x} < 0.0, 0.0, {x})", set()
    if o == "leaky_relu":
        return f"tl.where({x} > 0.0, {x}, {x} * {_lit(p['negative_slope'])})", set()
    if o == "sigmoid":
        return f"1.0 / (1.0 + tl.exp(-{x}))", set()
    if o == "tanh":
        return f"_cudal1_tanh({x})", {"_cudal1_tanh"}
    if o == "gelu" and p["approximate"] == "tanh":
        return (f"0.5 * {x} * (1.0 + _cudal1_tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))",
                {"_cudal1_tanh"})
    if o == "gelu":
        return f"0.5 * {x} * (1.0 + tl.math.erf({x} * 0.7071067811865476))", set()
    if o == "silu":
        return f"{x} / (1.0 + tl.exp(-{x}))", set()
    if o == "mish":  # x * tanh(softplus(x)), softplus with PyTorch's threshold 20
        return (f"{x} * _cudal1_tanh(tl.where({x} > 20.0, {x}, _cudal1_log1p_exp({x})))",
                {"_cudal1_tanh", "_cudal1_log1p_exp"})
    if o in ("clamp", "hardtanh"):
        lo, hi = p.get("min", p.get("min_val")), p.get("max", p.get("max_val"))
        e = x
        if lo is not None:
            e = f"tl.where({x} < {_lit(lo)}, {_lit(lo)}, {x})"
        if hi is not None:  # lo <= hi, so testing x against hi is the same as testing max(x, lo)
            e = f"tl.where({x} > {_lit(hi)}, {_lit(hi)}, {e})"
        return e, set()
    if o == "hardswish":
        return f"{x} * tl.minimum(tl.maximum({x} + 3.0, 0.0), 6.0) / 6.0", set()
    if o == "hardsigmoid":
        return f"tl.minimum(tl.maximum({x} + 3.0, 0.0), 6.0) / 6.0", set()
    if o == "softplus":
        beta, thr = float(p["beta"]), float(p["threshold"])
        if beta == 1.0:
            return f"tl.where({x} > {_lit(thr)}, {x}, _cudal1_log1p_exp({x}))", {"_cudal1_log1p_exp"}
        bx = f"({x} * {_lit(beta)})"
        return f"tl.where({bx} > {_lit(thr)}, {x}, _cudal1_log1p_exp({bx}) / {_lit(beta)})", {"_cudal1_log1p_exp"}
    if o == "elu":
        return f"tl.where({x} > 0.0, {x}, (tl.exp({x}) - 1.0) * {_lit(p['alpha'])})", set()
    if o == "selu":
        neg = _lit(_SELU_ALPHA * _SELU_SCALE)
        return f"tl.where({x} > 0.0, {x} * {_lit(_SELU_SCALE)}, (tl.exp({x}) - 1.0) * {neg})", set()
    if o == "celu":
        alpha = float(p["alpha"])
        return f"tl.where({x} > 0.0, {x}, (tl.exp({x} / {_lit(alpha)}) - 1.0) * {_lit(alpha)})", set()
    if o == "softsign":
        return f"{x} / (1.0 + tl.abs({x}))", set()
    if o == "logsigmoid":
        return f"tl.minimum({x}, 0.0) - tl.log(1.0 + tl.exp(-tl.abs({x})))", set()
    if o == "tanhshrink":
        return f"{x} - _cudal1_tanh({x})", {"_cudal1_tanh"}
    if o == "threshold":
        return f"tl.where({x} > {_lit(p['threshold'])}, {x}, {_lit(p['value'])})", set()
    if o == "exp":
        return f"tl.exp({x})", set()
    if o == "log":
        return f"tl.log({x})", set()
    if o == "abs":
        return f"tl.abs({x})", set()
    if o == "neg":
        return f"-{x}", set()
    if o == "sqrt":
        return f"tl.sqrt_rn({x})", set()
    if o == "rsqrt":
        return f"tl.rsqrt({x})", set()
    if o == "reciprocal":
        return f"1.0 / {x}", set()
    if o == "square":
        return f"{x} * {x}", set()
    if o == "erf":
        return f"tl.math.erf({x})", set()
    if o == "pow":
        return _POWERS[p["exponent"]].format(x=x), set()
    y = a[1]
    if o in ("add", "sub"):
        alpha = p.get("alpha", 1)
        if alpha != 1:
            y = f"{_lit(alpha)} * {y}"
        return f"{x} {'+' if o == 'add' else '-'} {y}", set()
    if o == "mul":
        return f"{x} * {y}", set()
    if o == "div":
        return f"{x} / {y}", set()
    if o == "maximum":
        return f"tl.maximum({x}, {y}, propagate_nan=tl.PropagateNan.ALL)", set()
    if o == "minimum":
        return f"tl.minimum({x}, {y}, propagate_nan=tl.PropagateNan.ALL)", set()
    raise AssertionError(o)



# ---- regions (the unit of generation) -----------------------------------------------------------

def tensor_meta(node: Any) -> Any:
    return node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None



@dataclass
class Region:
    nodes: list[fx.Node]  # in graph order; the last one is the output
    full: list[fx.Node] = field(default_factory=list)  # inputs of the output's shape
    # broadcast input → (first output dim of its run, first output dim after it, its numel)
    broadcast: dict[fx.Node, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def out(self) -> fx.Node:
        return self.nodes[-1]


# ---- code generation -------------------------------------------------------------------------------

_RESERVED = {"offs", "mask", "n", "out", "out_ptr", "BLOCK", "grid", "tl", "triton", "torch", "math"}


class _Names:
    def __init__(self) -> None:
        self.used = set(_RESERVED) | {h for h in HELPERS}

    def take(self, hint: str) -> str:
        base = hint if hint.isidentifier() and not hint.startswith("_cudal1") else "v"
        name, i = base, 1
        while name in self.used or any(name == u + s for u in self.used for s in ("_ptr", "_inner", "_size")) or \
                any(u == name + s for u in self.used for s in ("_ptr", "_inner", "_size")):
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


@dataclass
class Generated:
    name: str  # launcher name
    source: str  # kernel + launcher
    helpers: set[str]
    args: list[fx.Node]  # launcher arguments, in order
    note: str  # what was fused, where, and the kernel count (the pass appends the cost estimate)


def generate(region: Region, ops: dict[fx.Node, Op], index: int) -> Generated:
    """Kernel and launcher source for ``region`` (launcher ``_cudal1_fused_<index>``)."""
    name = f"_cudal1_fused_{index}"
    names = _Names()
    var: dict[fx.Node, str] = {}
    inputs = region.full + list(region.broadcast)
    for a in inputs:
        var[a] = names.take(a.name)
    body, helpers = [], set()
    body.append("offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)")
    body.append("mask = offs < n")
    for a in region.full:
        body.append(f"{var[a]} = tl.load({var[a]}_ptr + offs, mask=mask).to(tl.float32)")
    for a, (_, _, size) in region.broadcast.items():
        v = var[a]
        if size == 1:
            body.append(f"{v} = tl.load({v}_ptr).to(tl.float32)")
        else:
            body.append(f"{v} = tl.load({v}_ptr + (offs // {v}_inner) % {v}_size, mask=mask).to(tl.float32)")
    for n in region.nodes:
        op = ops[n]
        operands = [var[o] if isinstance(o, fx.Node) else _lit(o) for o in op.operands]
        expr, used = _lower(op, operands)
        helpers |= used
        var[n] = names.take(n.name)
        body.append(f"{var[n]} = {expr}")
    body.append(f"tl.store(out_ptr + offs, {var[region.out]}.to(out_ptr.dtype.element_ty), mask=mask)")

    params = [f"{var[a]}_ptr" for a in inputs] + ["out_ptr", "n"]
    call = [var[a] for a in inputs] + ["out", "n"]
    for a, (_, k, size) in region.broadcast.items():
        if size != 1:
            params += [f"{var[a]}_inner", f"{var[a]}_size"]
            call += [f"math.prod(out.shape[{k}:])", f"{var[a]}.numel()"]
    kernel = ["@triton.jit", f"def {name}_kernel({', '.join(params)}, BLOCK: tl.constexpr):"]
    kernel += ["    " + ln for ln in body]

    out_meta = tensor_meta(region.out)
    first = region.full[0]
    chain = " → ".join(ops[n].label() for n in region.nodes)
    shape_s = "x".join(str(d) for d in out_meta.shape)
    dt = str(out_meta.dtype).replace("torch.", "")
    dtype_expr = f"{var[first]}.dtype" if tensor_meta(first).dtype == out_meta.dtype else str(out_meta.dtype)
    reads = [f"{var[a]} {_along(first_dim, k, size)}" for a, (first_dim, k, size) in region.broadcast.items()]
    launcher = [f"def {name}({', '.join(var[a] for a in inputs)}):",
                f'    """{chain}, in one pass in fp32.',
                "",
                f"    Traced as {shape_s} {dt}{'; ' + ', '.join(reads) if reads else ''}.",
                '    """']
    launcher += [f"    {var[a]} = {var[a]}.contiguous()" for a in inputs]
    launcher.append(f"    out = torch.empty({var[first]}.shape, dtype={dtype_expr}, device={var[first]}.device)")
    for a in region.full[1:]:
        launcher.append(f"    assert {var[a]}.shape == out.shape, 'fused operands must have the same shape'")
    launcher.append("    n = out.numel()")
    launcher.append("    if out.device.type == \"meta\" or n == 0:  # shape-only run: nothing to compute")
    launcher.append("        return out")
    launcher.append("    assert n < 2**31, 'int32 offsets'")
    launcher.append(f"    grid = (triton.cdiv(n, {BLOCK}),)")
    launcher.append(f"    {name}_kernel[grid]({', '.join(call)}, BLOCK={BLOCK})")
    launcher.append("    return out")

    note = (f"{chain}: fused into one Triton kernel {name} over the {shape_s} {dt} tensor"
            f"{' (' + ', '.join(reads) + ')' if reads else ''}; {len(region.nodes)} kernels → 1")
    return Generated(name, "\n".join(kernel) + "\n\n\n" + "\n".join(launcher), helpers, inputs, note)


def _along(first: int, end: int, size: int) -> str:
    if size == 1:
        return "a single value"
    return f"per index of dim {first}" if end == first + 1 else f"per index of dims {first}..{end - 1}"


def exec_source(source: str, namespace: dict[str, Any], tag: str) -> None:
    """Execute generated source so that ``inspect.getsource`` (which ``@triton.jit`` needs) finds it."""
    filename = f"<cudal1-triton-fusion-{tag}-{id(namespace):x}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
