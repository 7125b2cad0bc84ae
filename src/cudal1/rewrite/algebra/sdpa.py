"""Graph pass ``sdpa``: manual attention → ``F.scaled_dot_product_attention``.

Contract (:data:`SDPA`): ``softmax(Q Kᵀ · s [masked_fill(cond, -inf)] [dropout p=0]) V`` over the
last dim, with Q, K, V of the same batch dims (3-D or more), becomes
``scaled_dot_product_attention(Q, K, V, attn_mask=~cond, scale=s)``; a scale written as
``1/√(k.size(-1))`` is recognised as SDPA's default (exact for every head size).  The score matrix
is then never stored.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from cudal1.rewrite.graph.emit import eliminate_dead_code
from cudal1.rewrite.graph.patterns import arg, is_last_two_swap, is_number, module_of, op_name, single_use
from cudal1.rewrite.graph.rewrite import Rewrite
from cudal1.rewrite.graph.trace import is_floating, ndim, shape


def _head_dim(s: fx.Node) -> int | None:
    """Head size E of the QKᵀ product under ``s`` (walking down scalings and masks)."""
    while isinstance(s, fx.Node) and op_name(s) != "matmul" and s.args and isinstance(s.args[0], fx.Node):
        s = s.args[0]
    if isinstance(s, fx.Node) and op_name(s) == "matmul" and shape(s.args[0]):
        return shape(s.args[0])[-1]
    return None


def _softmax_dim_last(node: fx.Node) -> bool:
    nd = ndim(node.args[0]) if node.args else None
    if op_name(node) == "Softmax":
        d = module_of(node).dim
    elif op_name(node) == "softmax":
        d = arg(node, 1, "dim")
        if arg(node, 2, "dtype") is not None or node.kwargs.get("dtype") is not None:
            return False
    else:
        return False
    return isinstance(d, int) and nd is not None and d % nd == nd - 1


def _strip_identity(node: object) -> object:
    while isinstance(node, fx.Node) and op_name(node) in ("dropout", "Dropout"):
        p = module_of(node).p if node.op == "call_module" else arg(node, 1, "p", 0.5)
        if p != 0 or not single_use(node):
            break
        node = node.args[0]
    return node


_MATH = {operator.truediv: operator.truediv, operator.mul: operator.mul, operator.pow: operator.pow,
         math.sqrt: math.sqrt, operator.floordiv: operator.floordiv}


def _shape_value(node: object) -> float | None:
    """The value of a scalar expression built from tensor sizes and numbers (e.g.
    ``1.0 / math.sqrt(k.size(-1))``), from the recorded shapes; None if it is anything else."""
    if is_number(node):
        return float(node)
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_method" and node.target == "size" and len(node.args) == 2 and shape(node.args[0]):
        return float(shape(node.args[0])[node.args[1]])
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[1], int):
        base = node.args[0]
        if isinstance(base, fx.Node) and (
            (base.op == "call_method" and base.target == "size" and len(base.args) == 1)
            or (op_name(base) == "getattr" and base.args[1] == "shape")
        ):
            s = shape(base.args[0])
            return float(s[node.args[1]]) if s else None
    if node.op == "call_function" and node.target in _MATH:
        values = [_shape_value(a) for a in node.args]
        if None in values or node.kwargs:
            return None
        try:
            return float(_MATH[node.target](*values))
        except (ZeroDivisionError, ValueError):
            return None
    return None


def _attention_scale(s: fx.Node, k_dim: int | None) -> tuple[fx.Node, float | None] | None:
    """``s`` as (base, scale) for ``base * c`` / ``base / c`` where c is a positive number or the
    head-size formula 1/√E (returned as None: SDPA's default, exact for every head size)."""
    name = op_name(s)
    if name not in ("mul", "div") or len(s.args) != 2 or s.kwargs:
        return None
    a, b = s.args
    base, c = (
        (a, b) if isinstance(a, fx.Node) and not (isinstance(b, fx.Node) and _shape_value(a) is not None) else (b, a)
    )
    if name == "div" and base is not a:
        return None
    value = _shape_value(c)
    if value is None or value <= 0 or not isinstance(base, fx.Node):
        return None
    value = value if name == "mul" else 1.0 / value
    if isinstance(c, fx.Node) and k_dim:  # shape-dependent: only the standard formula is accepted
        return (base, None) if math.isclose(value, 1.0 / math.sqrt(k_dim), rel_tol=1e-12) else None
    return base, value


def sdpa(gm: fx.GraphModule) -> list[str]:
    graph, notes = gm.graph, []
    for node in list(graph.nodes):
        if op_name(node) != "matmul" or len(node.args) != 2:
            continue
        probs, v = _strip_identity(node.args[0]), node.args[1]
        if not isinstance(probs, fx.Node) or op_name(probs) not in ("softmax", "Softmax") or not single_use(probs) \
                or not _softmax_dim_last(probs):
            continue
        s, scale, mask, default_scale = probs.args[0], 1.0, None, False
        while isinstance(s, fx.Node) and single_use(s):
            f = _attention_scale(s, _head_dim(s))
            if f is not None:
                s = f[0]
                if f[1] is None:
                    default_scale = True
                else:
                    scale *= f[1]
                continue
            if op_name(s) == "masked_fill" and mask is None:
                value = arg(s, 2, "value")
                cond = arg(s, 1, "mask")
                if is_number(value) and value == -math.inf and isinstance(cond, fx.Node):
                    mask, s = cond, s.args[0]
                    continue
            break
        if not isinstance(s, fx.Node) or op_name(s) != "matmul" or not single_use(s) or len(s.args) != 2:
            continue
        q, kt = s.args
        if not isinstance(kt, fx.Node) or not is_last_two_swap(kt, ndim(kt.args[0])) or not isinstance(q, fx.Node):
            continue
        k = kt.args[0]
        sq, sk, sv = shape(q), shape(k), shape(v)
        if default_scale:
            scale *= 1.0 / math.sqrt(sq[-1]) if sq else math.nan
        if (
            not (sq and sk and sv)
            or not (3 <= len(sq) == len(sk) == len(sv))
            or sq[:-2] != sk[:-2]
            or sk[:-2] != sv[:-2]
            or sq[-1] != sk[-1]
            or sk[-2] != sv[-2]
            or not all(is_floating(t) for t in (q, k, v))
        ):
            continue
        with graph.inserting_before(node):
            keep = graph.call_function(torch.logical_not, (mask,)) if mask is not None else None
            kwargs = {"attn_mask": keep} if keep is not None else {}
            if not (default_scale and scale == 1.0 / math.sqrt(sq[-1])):
                kwargs["scale"] = scale
            new = graph.call_function(F.scaled_dot_product_attention, (q, k, v), kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        notes.append(f"softmax(QKᵀ·{scale:.4g}{' masked' if mask is not None else ''}) V → "
                     f"scaled_dot_product_attention (fused; the {sq[-2]}x{sk[-2]} score matrix is never stored)")
    eliminate_dead_code(graph)
    return notes


SDPA = Rewrite("sdpa", "manual softmax(QKᵀ/√d)V → scaled_dot_product_attention", sdpa)
