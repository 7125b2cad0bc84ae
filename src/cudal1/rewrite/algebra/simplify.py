"""Graph pass ``simplify``: remove work that changes nothing.

Contract (:data:`SIMPLIFY`, see :class:`~cudal1.rewrite.graph.rewrite.Rewrite`): ``.detach()``;
``.clone()`` when nothing in the graph writes in place; casts to the tensor's own dtype; dropout
with p=0; sum/mean/amax/logsumexp/max over size-1 dims with keepdim; multiply/divide by 1, add or
subtract 0; a transpose of a transpose; scalar chains ``(x·a)·b → x·(ab)`` and
``x·a ± x·b → x·(a±b)`` (Python-number factors, single-use intermediates).  Each is an identity of
the function (up to rounding); nothing depends on input values.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from cudal1.rewrite.graph.emit import eliminate_dead_code
from cudal1.rewrite.graph.patterns import (
    arg,
    graph_has_mutation,
    is_last_two_swap,
    is_number,
    module_of,
    op_name,
    reduced_dims,
    single_use,
)
from cudal1.rewrite.graph.rewrite import Rewrite
from cudal1.rewrite.graph.trace import dtype, is_floating, ndim, shape

_IDENTITY_REDUCTIONS = {"sum", "mean", "amax", "amin", "logsumexp", "prod", "max", "min"}


def _scalar_factor(node: fx.Node) -> tuple[fx.Node, float] | None:
    """``node`` as (base, k) with node == base * k for a Python number k, or None."""
    name = op_name(node)
    if name == "mul":
        a, b = node.args[0], node.args[1] if len(node.args) > 1 else None
        if isinstance(a, fx.Node) and is_number(b):
            return a, float(b)
        if isinstance(b, fx.Node) and is_number(a):
            return b, float(a)
    if name == "div" and len(node.args) == 2 and not node.kwargs and isinstance(node.args[0], fx.Node) \
            and is_number(node.args[1]) and node.args[1] != 0:
        return node.args[0], 1.0 / float(node.args[1])
    if name == "neg":
        return node.args[0], -1.0
    return None


def _as_multiple(node: object) -> tuple[fx.Node, float] | None:
    if not isinstance(node, fx.Node):
        return None
    f = _scalar_factor(node)
    return f if f is not None else (node, 1.0)


def _identity_replacement(node: fx.Node, mutation: bool) -> tuple[object, str] | None:
    name = op_name(node)
    x = node.args[0] if node.args else None
    if not isinstance(x, fx.Node):
        return None
    if name == "detach":
        return x, "removed .detach() (values unchanged)"
    if name == "clone" and not mutation and "memory_format" not in node.kwargs:
        return x, "removed a redundant .clone() (nothing in the graph writes in place)"
    if name in ("to", "float") and dtype(x) is not None and dtype(x) == dtype(node) and \
            shape(x) == shape(node) and not node.kwargs.get("copy") and not mutation and \
            all(isinstance(a, torch.dtype) for a in node.args[1:]) and set(node.kwargs) <= {"dtype"}:
        return x, f"removed a cast to the tensor's own dtype ({dtype(x)})"
    if name in ("dropout", "Dropout"):
        p = module_of(node).p if node.op == "call_module" else arg(node, 1, "p", 0.5)
        if p == 0:
            return x, "removed dropout with p=0"
    if name in _IDENTITY_REDUCTIONS and is_floating(x) and name not in ("max", "min"):
        nd, s = ndim(x), shape(x)
        dims = reduced_dims(node, nd) if nd else None
        keep = arg(node, 2, "keepdim", False)
        if dims and keep is True and all(s[d] == 1 for d in dims):
            return x, f"removed {name} over size-1 dim(s) {list(dims)} (an identity)"
    if name in ("mul", "div") and _scalar_factor(node) and _scalar_factor(node)[1] == 1.0 and is_floating(node) \
            and shape(node) == shape(x):
        return _scalar_factor(node)[0], f"removed {name} by 1"
    if name in ("add", "sub") and len(node.args) == 2 and not node.kwargs and node.args[1] == 0 and is_floating(node):
        return x, f"removed {name} of 0"
    if is_last_two_swap(node, ndim(x)) and x.args and isinstance(x.args[0], fx.Node) and \
            is_last_two_swap(x, ndim(x.args[0])) and single_use(x):
        return x.args[0], "cancelled a transpose of a transpose"
    return None


def _max_min_identity(node: fx.Node) -> list[str]:
    """``torch.max(x, dim, keepdim=True)[0]`` over a size-1 dim → x (values only)."""
    x = node.args[0]
    nd, s = ndim(x), shape(x)
    dim = arg(node, 1, "dim")
    if (
        not isinstance(x, fx.Node)
        or not is_floating(x)
        or not nd
        or not isinstance(dim, int)
        or arg(node, 2, "keepdim") is not True
    ):
        return []
    if s[dim % nd] != 1 or not node.users or not all(
            (op_name(u) == "getitem" and u.args[1] == 0) or (op_name(u) == "getattr" and u.args[1] == "values")
            for u in node.users):
        return []
    for u in list(node.users):
        u.replace_all_uses_with(x)
    return [f"removed {op_name(node)} over size-1 dim {dim % nd} (an identity)"]


def simplify(gm: fx.GraphModule) -> list[str]:
    graph, notes = gm.graph, []
    mutation = graph_has_mutation(graph)
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module") or not node.users:
            continue
        if op_name(node) in ("max", "min") and len(node.args) + len(node.kwargs) >= 2:
            notes += _max_min_identity(node)
            continue
        rep = _identity_replacement(node, mutation)
        if rep is not None:
            node.replace_all_uses_with(rep[0])
            notes.append(rep[1])
            continue
        notes += _fold_scalars(graph, node)
    eliminate_dead_code(graph)
    return notes


def _fold_scalars(graph: fx.Graph, node: fx.Node) -> list[str]:
    """(y·a)·b → y·(ab); y·a ± y·b → y·(a ± b) — for Python-number factors, single-use inputs."""
    if not is_floating(node):
        return []
    name = op_name(node)
    f = _scalar_factor(node)
    if f is not None and name != "neg":
        inner = _scalar_factor(f[0]) if single_use(f[0]) else None
        if inner is not None and shape(inner[0]) == shape(node) and is_floating(inner[0]):
            with graph.inserting_before(node):
                new = graph.call_function(operator.mul, (inner[0], inner[1] * f[1]))
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            return [f"merged two scalar scalings into one multiply by {inner[1] * f[1]:g}"]
    if name in ("add", "sub") and len(node.args) == 2 and not node.kwargs:
        p, q = _as_multiple(node.args[0]), _as_multiple(node.args[1])
        if (
            p is None
            or q is None
            or p[0] is not q[0]
            or not (p[1] != 1.0 or q[1] != 1.0 or node.args[0] is node.args[1])
        ):
            return []
        for side in node.args:
            if side is not p[0] and not single_use(side):
                return []
        if shape(p[0]) != shape(node) or not is_floating(p[0]):
            return []
        k = p[1] + q[1] if name == "add" else p[1] - q[1]
        with graph.inserting_before(node):
            new = graph.call_function(operator.mul, (p[0], k))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        return [f"collapsed a linear combination of one tensor into a multiply by {k:g}"]
    return []


SIMPLIFY = Rewrite(
    "simplify", "remove redundant copies, casts, transposes and identity reductions; merge scalar chains", simplify
)
