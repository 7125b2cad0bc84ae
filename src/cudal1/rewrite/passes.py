"""Algebraic rewrites on a traced task graph: the registry ``GRAPH_PASSES``.

Contract: each pass takes the task's :class:`torch.fx.GraphModule` (shapes recorded in
``node.meta["tensor_meta"]`` on the meta device), rewrites matching patterns in place and returns
one human-readable note per rewrite; an empty list means the pass declined (pattern absent, or
present but not worth it by shape arithmetic).  Every rewrite preserves the function on all valid
inputs (up to floating-point rounding, which the judge's tolerance bounds): no rewrite relies on
input values or on a degenerate task.  New weight expressions are built from ``get_attr`` nodes, so
the emitter can precompute them (see :mod:`cudal1.rewrite.emit`).

Passes: ``simplify`` (redundant copies, detaches, casts, transposes, identity reductions, scalar
chains), ``diag-broadcast`` (diag(v) @ M → v[:, None] * M), ``matmul-chain`` (re-parenthesise
matrix chains by shape), ``fold-linear`` (consecutive affine maps and scalar scalings folded into
one ``F.linear``), ``reduce-through-linear`` (sum/mean over the output features of an affine map
folded into its weights), ``sdpa`` (manual softmax(QKᵀ·s [masked]) V → fused
``scaled_dot_product_attention``), and last ``triton-fusion`` (elementwise chains → one generated
Triton kernel; :mod:`cudal1.rewrite.triton_fusion`).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn.functional as F

from cudal1.rewrite.emit import eliminate_dead_code
from cudal1.rewrite.graph_pass import GraphPass
from cudal1.rewrite.patterns import (arg, graph_has_mutation, is_last_two_swap, is_number, module_of, op_name,
                                     reduced_dims, single_use)
from cudal1.rewrite.trace import dtype, is_constant, reset_constant_memo, shape
from cudal1.rewrite.triton_fusion import TRITON_FUSION

__all__ = ["GRAPH_PASSES", "GraphPass"]


def _ndim(node: object) -> int | None:
    s = shape(node)
    return len(s) if s is not None else None


def _floating(node: object) -> bool:
    d = dtype(node)
    return d is not None and d.is_floating_point


# ---- simplify -----------------------------------------------------------------------------------

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
    if name in _IDENTITY_REDUCTIONS and _floating(x) and name not in ("max", "min"):
        nd, s = _ndim(x), shape(x)
        dims = reduced_dims(node, nd) if nd else None
        keep = arg(node, 2, "keepdim", False)
        if dims and keep is True and all(s[d] == 1 for d in dims):
            return x, f"removed {name} over size-1 dim(s) {list(dims)} (an identity)"
    if name in ("mul", "div") and _scalar_factor(node) and _scalar_factor(node)[1] == 1.0 and _floating(node) \
            and shape(node) == shape(x):
        return _scalar_factor(node)[0], f"removed {name} by 1"
    if name in ("add", "sub") and len(node.args) == 2 and not node.kwargs and node.args[1] == 0 and _floating(node):
        return x, f"removed {name} of 0"
    if is_last_two_swap(node, _ndim(x)) and x.args and isinstance(x.args[0], fx.Node) and \
            is_last_two_swap(x, _ndim(x.args[0])) and single_use(x):
        return x.args[0], "cancelled a transpose of a transpose"
    return None


def _max_min_identity(node: fx.Node) -> list[str]:
    """``torch.max(x, dim, keepdim=True)[0]`` over a size-1 dim → x (values only)."""
    x = node.args[0]
    nd, s = _ndim(x), shape(x)
    dim = arg(node, 1, "dim")
    if not isinstance(x, fx.Node) or not _floating(x) or not nd or not isinstance(dim, int) or arg(node, 2, "keepdim") is not True:
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
    if not _floating(node):
        return []
    name = op_name(node)
    f = _scalar_factor(node)
    if f is not None and name != "neg":
        inner = _scalar_factor(f[0]) if single_use(f[0]) else None
        if inner is not None and shape(inner[0]) == shape(node) and _floating(inner[0]):
            with graph.inserting_before(node):
                new = graph.call_function(operator.mul, (inner[0], inner[1] * f[1]))
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            return [f"merged two scalar scalings into one multiply by {inner[1] * f[1]:g}"]
    if name in ("add", "sub") and len(node.args) == 2 and not node.kwargs:
        p, q = _as_multiple(node.args[0]), _as_multiple(node.args[1])
        if p is None or q is None or p[0] is not q[0] or not (p[1] != 1.0 or q[1] != 1.0 or node.args[0] is node.args[1]):
            return []
        for side in node.args:
            if side is not p[0] and not single_use(side):
                return []
        if shape(p[0]) != shape(node) or not _floating(p[0]):
            return []
        k = p[1] + q[1] if name == "add" else p[1] - q[1]
        with graph.inserting_before(node):
            new = graph.call_function(operator.mul, (p[0], k))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        return [f"collapsed a linear combination of one tensor into a multiply by {k:g}"]
    return []


# ---- diag(v) @ M ----------------------------------------------------------------------------------

def _diag_vector(node: object) -> fx.Node | None:
    if isinstance(node, fx.Node) and op_name(node) == "diag" and _ndim(node.args[0]) == 1 and \
            arg(node, 1, "diagonal", 0) == 0:
        return node.args[0]
    return None


def diag_broadcast(gm: fx.GraphModule) -> list[str]:
    graph, notes = gm.graph, []
    for node in list(graph.nodes):
        if op_name(node) != "matmul" or len(node.args) != 2:
            continue
        a, b = node.args
        va, vb = _diag_vector(a), _diag_vector(b)
        if va is not None and vb is None and isinstance(b, fx.Node) and (_ndim(b) or 0) >= 2:
            with graph.inserting_before(node):
                col = graph.call_method("unsqueeze", (va, -1))
                new = graph.call_function(operator.mul, (col, b))
            notes.append(f"diag(v) @ M → v[:, None] * M ({shape(a)[0]}x{shape(a)[0]} diagonal matrix never built)")
        elif vb is not None and va is None and isinstance(a, fx.Node) and (_ndim(a) or 0) >= 2:
            with graph.inserting_before(node):
                new = graph.call_function(operator.mul, (a, vb))
            notes.append(f"M @ diag(v) → M * v ({shape(b)[0]}x{shape(b)[0]} diagonal matrix never built)")
        else:
            continue
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
    eliminate_dead_code(graph)
    return notes


# ---- matrix chains ------------------------------------------------------------------------------

def _chain_operands(node: fx.Node, top: bool = True) -> list[object]:
    if op_name(node) == "matmul" and len(node.args) == 2 and (top or single_use(node)) and all(
            _ndim(a) == 2 for a in node.args if _chain_member(a)):
        if all(_ndim(a) == 2 for a in node.args):
            return _chain_operands(node.args[0], False) + _chain_operands(node.args[1], False)
    return [node]


def _chain_member(a: object) -> bool:
    return isinstance(a, fx.Node) and op_name(a) == "matmul"


def _tree_cost(node: object, leaves: set) -> int:
    if node in leaves or not isinstance(node, fx.Node) or op_name(node) != "matmul":
        return 0
    a, b = node.args
    (m, k), n = shape(a), shape(b)[1]
    return m * k * n + _tree_cost(a, leaves) + _tree_cost(b, leaves)


def matmul_chain(gm: fx.GraphModule) -> list[str]:
    graph, notes = gm.graph, []
    for node in reversed(list(graph.nodes)):
        if node.graph is not graph or op_name(node) != "matmul":
            continue
        if any(op_name(u) == "matmul" and single_use(node) for u in node.users):
            continue  # not the top of its chain
        ops = _chain_operands(node)
        if len(ops) < 3 or not all(_ndim(o) == 2 for o in ops):
            continue
        dims = [shape(ops[0])[0]] + [shape(o)[1] for o in ops]
        n = len(ops)
        cost = [[0] * n for _ in range(n)]
        split = [[0] * n for _ in range(n)]
        for length in range(2, n + 1):
            for i in range(n - length + 1):
                j = i + length - 1
                cost[i][j] = math.inf
                for k in range(i, j):
                    c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                    if c < cost[i][j]:
                        cost[i][j], split[i][j] = c, k
        current = _tree_cost(node, set(ops))
        if cost[0][n - 1] * 1.5 > current:
            continue

        def build(i: int, j: int) -> object:
            if i == j:
                return ops[i]
            k = split[i][j]
            return graph.call_function(torch.matmul, (build(i, k), build(k + 1, j)))

        with graph.inserting_before(node):
            new = build(0, n - 1)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        notes.append(f"re-parenthesised a chain of {n} matrices by shape: {current / cost[0][n - 1]:.1f}x fewer FLOPs")
    eliminate_dead_code(graph)
    return notes


# ---- affine folding -----------------------------------------------------------------------------

@dataclass
class _Form:
    """node == F.linear(root, W, b) (then squeeze(-1) when ``squeeze``); W, b are constant nodes."""

    root: fx.Node
    W: fx.Node
    b: fx.Node | None
    out: int
    nodes: list[fx.Node] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    squeeze: bool = False
    reduces: bool = False


def _weight_of(graph: fx.Graph, c: fx.Node) -> fx.Node:
    """W (out × in) for ``x @ c`` with constant c (in × out): c's transpose, unwrapping ``.T``."""
    if is_last_two_swap(c, 2) and isinstance(c.args[0], fx.Node):
        return c.args[0]
    return graph.call_method("t", (c,))


def _linear_start(graph: fx.Graph, node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None] | None:
    """(input, W, b) when ``node`` is an affine map with constant weights."""
    name = op_name(node)
    if name == "Linear":
        mod = module_of(node)
        w = graph.get_attr(f"{node.target}.weight")
        b = graph.get_attr(f"{node.target}.bias") if mod.bias is not None else None
        return node.args[0], w, b
    if name == "linear":
        x, w, b = node.args[0], arg(node, 1, "weight"), arg(node, 2, "bias")
        if isinstance(w, fx.Node) and is_constant(w) and (b is None or isinstance(b, fx.Node) and is_constant(b)):
            return x, w, b
    if name == "matmul" and len(node.args) == 2:
        x, c = node.args
        if isinstance(c, fx.Node) and is_constant(c) and _ndim(c) == 2 and isinstance(x, fx.Node) \
                and not is_constant(x) and (_ndim(x) or 0) >= 1:
            return x, _weight_of(graph, c), None
    return None


def _feature_vector(graph: fx.Graph, c: object, out: int, result: fx.Node, x: fx.Node) -> object:
    """A Python number, or a constant node broadcasting only along the last dim, as a scalar or
    a length-``out`` vector node; None if ``c`` is neither or broadcasting would change the shape."""
    if shape(result) != shape(x):
        return None
    if is_number(c):
        return float(c)
    if isinstance(c, fx.Node) and is_constant(c) and shape(c) is not None:
        s = shape(c)
        if all(d == 1 for d in s[:-1]) and (not s or s[-1] in (1, out)):
            return graph.call_method("reshape", (c, (-1,)))
    return None


def _scale(graph: fx.Graph, f: _Form, v: object, op: str) -> None:
    fn = operator.mul if op == "mul" else operator.truediv
    if isinstance(v, fx.Node):
        f.W = graph.call_function(fn, (f.W, graph.call_method("unsqueeze", (v, -1))))
    else:
        f.W = graph.call_function(fn, (f.W, v))
    if f.b is not None:
        f.b = graph.call_function(fn, (f.b, v))


def _shift(graph: fx.Graph, f: _Form, v: object, sign: float) -> None:
    if f.b is None:
        f.b = graph.call_method("new_zeros", (f.W, (f.out,)))
    f.b = graph.call_function(operator.add if sign > 0 else operator.sub, (f.b, v))


def _extend(graph: fx.Graph, node: fx.Node, forms: dict, reductions: bool) -> _Form | None:
    name = op_name(node)
    if name is None or not _floating(node):
        return None
    inputs = [a for a in node.args if isinstance(a, fx.Node)]
    if name in ("add", "sub") and len(node.args) == 2 and not node.kwargs and all(
            isinstance(a, fx.Node) and a in forms for a in node.args):
        p, q = forms[node.args[0]], forms[node.args[1]]
        if p.root is not q.root or p.squeeze or q.squeeze or node.args[0] is node.args[1] or p.out != q.out \
                or not all(single_use(a) for a in node.args) or shape(node) != shape(node.args[0]):
            return None
        fn = operator.add if name == "add" else operator.sub
        W = graph.call_function(fn, (p.W, q.W))
        if p.b is None and q.b is None:
            b = None
        elif q.b is None:
            b = p.b
        elif p.b is None:
            b = q.b if name == "add" else graph.call_function(operator.neg, (q.b,))
        else:
            b = graph.call_function(fn, (p.b, q.b))
        return _Form(p.root, W, b, p.out, p.nodes + q.nodes + [node], p.ops + q.ops + [name])
    src = next((a for a in inputs if a in forms), None)
    if src is None or not single_use(src) or forms[src].squeeze:
        return None
    prev = forms[src]
    f = _Form(prev.root, prev.W, prev.b, prev.out, prev.nodes + [node], prev.ops + [name], reduces=prev.reduces)
    other = [a for a in node.args if a is not src]
    if name in ("mul", "div") and len(node.args) == 2 and not node.kwargs and len(other) == 1:
        if name == "div" and node.args[0] is not src:
            return None
        v = _feature_vector(graph, other[0], f.out, node, src)
        if v is None or (not isinstance(v, fx.Node) and v == 0 and name == "div"):
            return None
        _scale(graph, f, v, name)
        return f
    if name in ("add", "sub") and len(node.args) == 2 and not node.kwargs and len(other) == 1:
        v = _feature_vector(graph, other[0], f.out, node, src)
        if v is None:
            return None
        if name == "sub" and node.args[1] is src:  # c - form
            _scale(graph, f, -1.0, "mul")
            _shift(graph, f, v, +1)
        else:
            _shift(graph, f, v, +1 if name == "add" else -1)
        return f
    if name == "neg":
        _scale(graph, f, -1.0, "mul")
        return f
    if name in ("sum", "mean") and reductions:
        nd = _ndim(src)
        dims = reduced_dims(node, nd) if nd else None
        if dims != (nd - 1,) or set(node.kwargs) - {"dim", "keepdim"}:
            return None
        keep = arg(node, 2, "keepdim", False) is True
        f.W = graph.call_method(name, (f.W, 0), {"keepdim": True})
        if f.b is not None:
            f.b = graph.call_method(name, (f.b, 0), {"keepdim": True})
        f.out, f.squeeze, f.reduces = 1, not keep, True
        return f
    return None


def _compose(graph: fx.Graph, node: fx.Node, forms: dict) -> _Form | None:
    start = _linear_start(graph, node)
    if start is None:
        return None
    x, W2, b2 = start
    out2 = shape(node)[-1] if shape(node) else None
    if out2 is None:
        return None
    prev = forms.get(x) if isinstance(x, fx.Node) else None
    if prev is not None and single_use(x) and not prev.squeeze:
        n_in = shape(prev.root)[-1]
        if n_in * out2 <= n_in * prev.out + prev.out * out2:
            W = graph.call_function(torch.matmul, (W2, prev.W))
            b = graph.call_function(torch.matmul, (W2, prev.b)) if prev.b is not None else None
            if b2 is not None:
                b = graph.call_function(operator.add, (b, b2)) if b is not None else b2
            return _Form(prev.root, W, b, out2, prev.nodes + [node], prev.ops + [op_name(node)], reduces=prev.reduces)
    return _Form(x, W2, b2, out2, [node], [op_name(node)])


def _fold_affine(gm: fx.GraphModule, reductions: bool) -> list[str]:
    graph, notes = gm.graph, []
    forms: dict[fx.Node, _Form] = {}
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        with graph.inserting_before(node):
            f = _compose(graph, node, forms) or _extend(graph, node, forms, reductions)
        if f is not None and isinstance(f.root, fx.Node) and _ndim(f.root):
            forms[node] = f
    reset_constant_memo(graph)
    done: set[fx.Node] = set()
    for node in reversed(list(graph.nodes)):
        f = forms.get(node)
        if f is None or node in done or len(f.ops) < 2 or f.reduces != reductions:
            continue
        if any(u in forms and node in forms[u].nodes for u in node.users):
            continue  # a longer chain covers it
        inner = set(f.nodes) - {node}
        if any(not set(n.users) <= set(f.nodes) for n in inner):
            continue  # an intermediate is used elsewhere: folding would not remove work
        with graph.inserting_before(node):
            new = graph.call_function(F.linear, (f.root, f.W, f.b))
            if f.squeeze:
                new = graph.call_method("squeeze", (new, -1))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        done |= set(f.nodes)
        n_in = shape(f.root)[-1]
        what = "reduction folded into the weights" if f.reduces else "affine maps folded into one"
        notes.append(f"{' → '.join(f.ops)}: {what} (one {n_in}→{f.out} linear map)")
    eliminate_dead_code(graph)
    return notes


def fold_linear(gm: fx.GraphModule) -> list[str]:
    return _fold_affine(gm, reductions=False)


def reduce_through_linear(gm: fx.GraphModule) -> list[str]:
    return _fold_affine(gm, reductions=True)


# ---- attention ----------------------------------------------------------------------------------

def _head_dim(s: fx.Node) -> int | None:
    """Head size E of the QKᵀ product under ``s`` (walking down scalings and masks)."""
    while isinstance(s, fx.Node) and op_name(s) != "matmul" and s.args and isinstance(s.args[0], fx.Node):
        s = s.args[0]
    if isinstance(s, fx.Node) and op_name(s) == "matmul" and shape(s.args[0]):
        return shape(s.args[0])[-1]
    return None


def _softmax_dim_last(node: fx.Node) -> bool:
    nd = _ndim(node.args[0]) if node.args else None
    if op_name(node) == "Softmax":
        d = module_of(node).dim
    elif op_name(node) == "softmax":
        d = arg(node, 1, "dim")
        if node.op == "call_function" and "_stacklevel" in node.kwargs:
            pass
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
        if isinstance(base, fx.Node) and ((base.op == "call_method" and base.target == "size" and len(base.args) == 1) or
                                          (op_name(base) == "getattr" and base.args[1] == "shape")):
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
    base, c = (a, b) if isinstance(a, fx.Node) and not (isinstance(b, fx.Node) and _shape_value(a) is not None) else (b, a)
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
            k_dim = None
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
        if not isinstance(kt, fx.Node) or not is_last_two_swap(kt, _ndim(kt.args[0])) or not isinstance(q, fx.Node):
            continue
        k = kt.args[0]
        sq, sk, sv = shape(q), shape(k), shape(v)
        if default_scale:
            scale *= 1.0 / math.sqrt(sq[-1]) if sq else math.nan
        if not (sq and sk and sv) or not (3 <= len(sq) == len(sk) == len(sv)) or sq[:-2] != sk[:-2] or sk[:-2] != sv[:-2] \
                or sq[-1] != sk[-1] or sk[-2] != sv[-2] or not all(_floating(t) for t in (q, k, v)):
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


GRAPH_PASSES: dict[str, GraphPass] = {
    p.name: p
    for p in (
        GraphPass("simplify", "remove redundant copies, casts, transposes and identity reductions; merge scalar chains",
                  simplify),
        GraphPass("diag-broadcast", "diag(v) @ M → v[:, None] * M (no dense diagonal matrix)", diag_broadcast),
        GraphPass("matmul-chain", "re-parenthesise matrix chains by shape (fewest FLOPs)", matmul_chain),
        GraphPass("fold-linear", "fold consecutive affine maps and scalings into one linear map", fold_linear),
        GraphPass("reduce-through-linear", "fold sum/mean over a linear map's outputs into its weights",
                  reduce_through_linear),
        GraphPass("sdpa", "manual softmax(QKᵀ/√d)V → scaled_dot_product_attention", sdpa),
        TRITON_FUSION,  # last: fuses what the algebraic passes left
    )
}
