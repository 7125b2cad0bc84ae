"""Graph pass ``triton-reduce``: softmax, normalizations and one-dim reductions → generated Triton
kernels with autotuned launch configurations.

Contract: :func:`run` replaces, in a traced task graph (shapes in ``node.meta["tensor_meta"]``,
after the algebraic passes), each of these operations on a float32/float16/bfloat16 tensor of at
least :data:`MIN_NUMEL` elements with a call to a launcher of
:mod:`cudal1.rewrite.triton_kernels.reduce_kernels` (whose source is appended, once, to
``gm.meta["cudal1_prelude"]``):

- softmax / log_softmax over the last dim (``torch.*``, ``F.*``, method, ``nn.Softmax``,
  ``nn.LogSoftmax``; no ``dtype=``);
- ``nn.LayerNorm`` / ``F.layer_norm``; ``nn.RMSNorm`` / ``F.rms_norm``; ``nn.GroupNorm`` /
  ``F.group_norm``; ``nn.InstanceNorm1d/2d/3d`` without running statistics;
- sum, mean, amax, amin, argmax, argmin over one given dim (``keepdim`` either way, no
  ``dtype=``), and ``max``/``min`` over a dim when only the values are used.

Declined (left to PyTorch): softmax over another dim, whole-tensor reductions, reductions over
several dims, BatchNorm (its statistics span a strided set), InstanceNorm with running stats,
constant subgraphs (the emitter precomputes those), and anything whose shape or dtype is unknown.
The launchers fall back to the PyTorch call for inputs the kernels do not take (see the kernel
module), so a candidate is correct on any input; the judge decides whether it is faster.
"""

from __future__ import annotations

import math
import operator
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from cudal1.extras import is_available
from cudal1.rewrite.graph.emit import eliminate_dead_code
from cudal1.rewrite.graph.patterns import arg, module_of
from cudal1.rewrite.graph.rewrite import Rewrite
from cudal1.rewrite.graph.trace import dtype, is_constant, ndim, reset_constant_memo, shape
from cudal1.rewrite.triton_kernels.codegen import exec_source
from cudal1.rewrite.triton_kernels.fusion import PRELUDE_KEY

NAME = "triton-reduce"
DESCRIPTION = "softmax, normalizations and reductions as generated Triton kernels with autotuned launch configurations"
MIN_NUMEL = 4096  # below this a kernel of our own cannot win anything worth a candidate
KERNELS = Path(__file__).with_name("reduce_kernels.py")
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

_SOFTMAX = {F.softmax: False, torch.softmax: False, F.log_softmax: True, torch.log_softmax: True}
_REDUCE_FUNCTIONS = {torch.sum: "sum", torch.mean: "mean", torch.amax: "amax", torch.amin: "amin",
                     torch.argmax: "argmax", torch.argmin: "argmin"}
_REDUCE_METHODS = {"sum", "mean", "amax", "amin", "argmax", "argmin"}
_INSTANCE_NORMS = {nn.InstanceNorm1d: 3, nn.InstanceNorm2d: 4, nn.InstanceNorm3d: 5}  # batched input ranks


def _taken(x: Any) -> bool:
    return isinstance(x, fx.Node) and dtype(x) in _FLOATS and shape(x) is not None and \
        math.prod(shape(x)) >= MIN_NUMEL and not is_constant(x)


def _one_dim(dim: Any, nd: int) -> int | None:
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    return dim % nd if isinstance(dim, int) and not isinstance(dim, bool) and nd else None


def _softmax(node: fx.Node) -> tuple[str, tuple, dict, str] | None:
    if node.op == "call_module" and isinstance(module_of(node), (nn.Softmax, nn.LogSoftmax)):
        mod = module_of(node)
        x, dim, log = node.args[0] if node.args else None, mod.dim, isinstance(mod, nn.LogSoftmax)
        extra_ok = len(node.args) == 1 and not node.kwargs
    elif node.op == "call_function" and node.target in _SOFTMAX:
        x, dim, log = node.args[0] if node.args else None, arg(node, 1, "dim"), _SOFTMAX[node.target]
        extra_ok = arg(node, 2, "dtype") is None and node.kwargs.get("dtype") is None and len(node.args) <= 2
    elif node.op == "call_method" and node.target in ("softmax", "log_softmax"):
        x, dim, log = node.args[0], arg(node, 1, "dim"), node.target == "log_softmax"
        extra_ok = arg(node, 2, "dtype") is None and node.kwargs.get("dtype") is None
    else:
        return None
    if not extra_ok or not _taken(x) or _one_dim(dim, ndim(x)) != ndim(x) - 1:
        return None
    what = "log_softmax" if log else "softmax"
    return "_cudal1_softmax", (x, -1, log), {}, f"{what} over the last dim of {_shape_text(x)}"


def _norm(node: fx.Node) -> tuple[str, tuple, dict, str] | None:
    if node.op == "call_module":
        mod = module_of(node)
        x = node.args[0] if len(node.args) == 1 and not node.kwargs else None
        if x is None or not _taken(x):
            return None
        g = node.graph
        w = g.get_attr(f"{node.target}.weight") if getattr(mod, "weight", None) is not None else None
        b = g.get_attr(f"{node.target}.bias") if getattr(mod, "bias", None) is not None else None
        if isinstance(mod, nn.LayerNorm):
            return "_cudal1_layer_norm", (x, tuple(mod.normalized_shape), w, b, mod.eps), {}, \
                f"LayerNorm over {tuple(mod.normalized_shape)} of {_shape_text(x)}"
        if hasattr(nn, "RMSNorm") and isinstance(mod, nn.RMSNorm):
            return "_cudal1_rms_norm", (x, tuple(mod.normalized_shape), w, mod.eps), {}, \
                f"RMSNorm over {tuple(mod.normalized_shape)} of {_shape_text(x)}"
        if isinstance(mod, nn.GroupNorm):
            return "_cudal1_group_norm", (x, mod.num_groups, w, b, mod.eps), {}, \
                f"GroupNorm ({mod.num_groups} groups) of {_shape_text(x)}"
        if isinstance(mod, tuple(_INSTANCE_NORMS)) and not mod.track_running_stats and \
                ndim(x) == _INSTANCE_NORMS[type(mod)]:
            return "_cudal1_instance_norm", (x, w, b, mod.eps), {}, f"{type(mod).__name__} of {_shape_text(x)}"
        return None
    if node.op != "call_function" or not node.args or not _taken(node.args[0]):
        return None
    x = node.args[0]
    if node.target is F.layer_norm:
        ns, w, b, eps = arg(node, 1, "normalized_shape"), arg(node, 2, "weight"), arg(node, 3, "bias"), \
            arg(node, 4, "eps", 1e-5)
        if isinstance(ns, (list, tuple)) and all(isinstance(d, int) for d in ns) and isinstance(eps, float):
            return (
                "_cudal1_layer_norm", (x, tuple(ns), w, b, eps), {},
                f"layer_norm over {tuple(ns)} of {_shape_text(x)}",
            )
    if getattr(F, "rms_norm", None) is not None and node.target is F.rms_norm:
        ns, w, eps = arg(node, 1, "normalized_shape"), arg(node, 2, "weight"), arg(node, 3, "eps")
        if (
            isinstance(ns, (list, tuple))
            and all(isinstance(d, int) for d in ns)
            and (eps is None or isinstance(eps, float))
        ):
            return "_cudal1_rms_norm", (x, tuple(ns), w, eps), {}, f"rms_norm over {tuple(ns)} of {_shape_text(x)}"
    if node.target is F.group_norm:
        groups, w, b, eps = arg(node, 1, "num_groups"), arg(node, 2, "weight"), arg(node, 3, "bias"), \
            arg(node, 4, "eps", 1e-5)
        if isinstance(groups, int) and isinstance(eps, float):
            return "_cudal1_group_norm", (x, groups, w, b, eps), {}, f"group_norm ({groups} groups) of {_shape_text(x)}"
    return None


def _reduction(node: fx.Node) -> tuple[str, tuple, dict, str] | None:
    if node.op == "call_function" and node.target in _REDUCE_FUNCTIONS:
        op = _REDUCE_FUNCTIONS[node.target]
    elif node.op == "call_method" and node.target in _REDUCE_METHODS:
        op = str(node.target)
    else:
        return None
    x = node.args[0] if node.args else None
    if not _taken(x) or set(node.kwargs) - {"dim", "keepdim"} or len(node.args) > 3:
        return None
    dim, keep = _one_dim(arg(node, 1, "dim"), ndim(x)), arg(node, 2, "keepdim", False)
    if dim is None or not isinstance(keep, bool):
        return None
    return "_cudal1_reduce", (x, dim, op, keep), {}, f"{op} over dim {dim} of {_shape_text(x)}"


def _max_min_values(node: fx.Node) -> tuple[fx.Node, tuple[str, tuple, dict, str]] | None:
    """``torch.max(x, dim[, keepdim])`` (or min, or the method) whose result is only read as its
    values (``[0]`` / ``.values``): (the node to replace, site)."""
    name = getattr(node.target, "__name__", node.target) if node.op in ("call_function", "call_method") else None
    if name not in ("max", "min") or (node.op == "call_function" and node.target not in (torch.max, torch.min)):
        return None
    x = node.args[0] if node.args else None
    dim = arg(node, 1, "dim")
    if not _taken(x) or not isinstance(dim, int) or isinstance(dim, bool) or set(node.kwargs) - {"dim", "keepdim"}:
        return None
    users = list(node.users)
    values = [u for u in users if u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0]
    if len(values) != 1 or len(users) != 1:
        return None
    keep = arg(node, 2, "keepdim", False)
    if not isinstance(keep, bool):
        return None
    op = "amax" if name == "max" else "amin"
    return values[0], ("_cudal1_reduce", (x, dim % ndim(x), op, keep), {},
                       f"{name} values over dim {dim % ndim(x)} of {_shape_text(x)}")


def _shape_text(x: fx.Node) -> str:
    return "x".join(map(str, shape(x))) + f" {str(dtype(x)).replace('torch.', '')}"


def run(gm: fx.GraphModule) -> list[str]:
    """The pass: every operation listed in the module docstring → its launcher; one note each."""
    if not is_available("triton"):  # the pass declines where Triton is not installed
        return []
    graph = gm.graph
    reset_constant_memo(graph)
    namespace: dict[str, Any] = {}
    notes = []
    for node in list(graph.nodes):  # replaced as found, so a later site reads the earlier one's output
        if node.op not in ("call_function", "call_method", "call_module") or not node.users:
            continue
        with graph.inserting_before(node):
            site = _softmax(node) or _norm(node) or _reduction(node)
        target = node
        if site is None:
            found = _max_min_values(node)
            if found is None:
                continue
            target, site = found
        if not namespace:
            namespace["__name__"] = "_cudal1_triton_reduce"
            exec_source(KERNELS.read_text(), namespace, "reduce")
        launcher, args, kwargs, what = site
        with graph.inserting_before(target):
            new = graph.create_node("call_function", namespace[launcher], args, kwargs, name="reduced")
        new.meta = dict(target.meta)
        target.replace_all_uses_with(new)
        notes.append(f"{what} → one Triton kernel ({launcher.removeprefix('_cudal1_')}, autotuned launch)")
    if notes:
        prelude: list[str] = gm.meta.setdefault(PRELUDE_KEY, [])
        source = KERNELS.read_text()
        if source not in prelude:
            prelude.append(source)
    eliminate_dead_code(graph)  # the replaced nodes, and get_attr nodes made while looking
    return notes


TRITON_REDUCE = Rewrite(NAME, DESCRIPTION, run)
