"""Recognise torch operations in an fx graph whatever spelling the source used.

``op_name(node)`` maps ``torch.matmul(a, b)``, ``a @ b``, ``a.matmul(b)`` and ``torch.mm`` to
``"matmul"``; ``x * 2``, ``torch.mul`` and ``x.mul`` to ``"mul"``; an ``nn.Linear`` call to
``"Linear"`` (the module's class name), and so on.  ``arg(node, i, name)`` reads an argument given
by position or keyword.  Everything here is pure inspection: nothing changes the graph.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

_FUNCTIONS: dict[Any, str] = {
    torch.matmul: "matmul", operator.matmul: "matmul", torch.mm: "matmul", torch.bmm: "matmul",
    operator.mul: "mul", torch.mul: "mul", torch.multiply: "mul",
    operator.truediv: "div", torch.div: "div", torch.true_divide: "div", torch.divide: "div",
    operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub", torch.subtract: "sub",
    operator.neg: "neg", torch.neg: "neg",
    torch.sum: "sum", torch.mean: "mean", torch.amax: "amax", torch.amin: "amin", torch.max: "max",
    torch.min: "min", torch.logsumexp: "logsumexp", torch.prod: "prod",
    torch.transpose: "transpose", torch.swapaxes: "transpose", torch.swapdims: "transpose", torch.t: "t",
    torch.permute: "permute",
    torch.diag: "diag", torch.softmax: "softmax", F.softmax: "softmax", F.linear: "linear",
    F.dropout: "dropout", torch.dropout: "dropout", torch.clone: "clone", torch.detach: "detach",
    operator.getitem: "getitem", builtins.getattr: "getattr", torch.masked_fill: "masked_fill",
    operator.eq: "eq", torch.eq: "eq", operator.ne: "ne", torch.ne: "ne",
}
_METHODS = {
    "matmul": "matmul", "mm": "matmul", "bmm": "matmul", "__matmul__": "matmul",
    "mul": "mul", "multiply": "mul", "div": "div", "true_divide": "div", "divide": "div",
    "add": "add", "sub": "sub", "subtract": "sub", "neg": "neg",
    "sum": "sum", "mean": "mean", "amax": "amax", "amin": "amin", "max": "max", "min": "min",
    "logsumexp": "logsumexp", "prod": "prod", "transpose": "transpose", "swapaxes": "transpose",
    "swapdims": "transpose", "t": "t", "permute": "permute", "softmax": "softmax", "clone": "clone",
    "detach": "detach", "contiguous": "contiguous", "to": "to", "float": "float", "masked_fill": "masked_fill",
    "eq": "eq", "ne": "ne", "unsqueeze": "unsqueeze", "view": "view", "reshape": "reshape",
}
# Views and other operations that cost nothing worth precomputing on their own.
CHEAP = {"getattr", "transpose", "t", "permute", "getitem", "unsqueeze", "view", "reshape", "detach", "contiguous"}


def op_name(node: Any) -> str | None:
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function":
        try:
            return _FUNCTIONS.get(node.target)
        except TypeError:  # unhashable target
            return None
    if node.op == "call_method":
        return _METHODS.get(node.target)
    if node.op == "call_module":
        return type(module_of(node)).__name__
    return None


def module_of(node: fx.Node) -> torch.nn.Module:
    mod = node.graph.owning_module
    for atom in str(node.target).split("."):
        mod = getattr(mod, atom)
    return mod


def arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_inplace(node: fx.Node) -> bool:
    """Mutates one of its inputs (``x.add_(…)``, ``out=``, ``inplace=True``, ``nn.ReLU(inplace=True)``)."""
    if node.op == "call_method" and str(node.target).endswith("_") and not str(node.target).startswith("__"):
        return True
    if node.kwargs.get("out") is not None or node.kwargs.get("inplace") is True:
        return True
    if node.op == "call_function" and getattr(node.target, "__name__", "").endswith("_") and \
            not getattr(node.target, "__name__", "").startswith("__"):
        return True
    if node.op == "call_module" and getattr(module_of(node), "inplace", False):
        return True
    return False


def graph_has_mutation(graph: fx.Graph) -> bool:
    return any(n.op.startswith("call") and is_inplace(n) for n in graph.nodes)


def is_last_two_swap(node: fx.Node, ndim: int | None) -> bool:
    """``x.T`` / ``x.mT`` / ``x.t()`` / ``transpose(-2, -1)`` (in any spelling) on an ``ndim``-D tensor."""
    name = op_name(node)
    if name == "getattr":
        return node.args[1] == "mT" or (node.args[1] == "T" and ndim == 2)
    if name == "t":
        return ndim == 2
    if name == "transpose" and ndim:
        a, b = arg(node, 1, "dim0"), arg(node, 2, "dim1")
        if not (isinstance(a, int) and isinstance(b, int)):
            return False
        return {a % ndim, b % ndim} == {ndim - 2, ndim - 1}
    return False


def reduced_dims(node: fx.Node, ndim: int) -> tuple[int, ...] | None:
    """Normalised dims a reduction node reduces over (None when not statically known)."""
    dim = arg(node, 1, "dim")
    if dim is None:
        return tuple(range(ndim)) if len(node.args) <= 1 and "dim" not in node.kwargs else None
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    if not all(isinstance(d, int) for d in dims):
        return None
    return tuple(sorted(d % ndim for d in dims))


def single_use(node: fx.Node) -> bool:
    return len(node.users) == 1
