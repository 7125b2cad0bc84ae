"""Graph passes ``fold-linear`` and ``reduce-through-linear``: an affine-form analysis.

Contract (:data:`FOLD_LINEAR`, :data:`REDUCE_THROUGH_LINEAR`): each node that is an affine
function of some root tensor — ``nn.Linear`` / ``F.linear`` / ``x @ C`` with constant ``C``,
scalar or per-feature scale and shift, negation, sums of two forms of the same root, and, for
``reduce-through-linear``, sum/mean over the last dim — gets ``(W, b)`` built as graph nodes from
the parameters (the emitter precomputes them).  Maximal chains whose intermediates are used
nowhere else become one ``F.linear(root, W, b)``.  Two linear maps are composed only when that
does not add FLOPs (``in·out <= in·h + h·out``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn.functional as F

from cudal1.rewrite.graph.emit import eliminate_dead_code
from cudal1.rewrite.graph.patterns import arg, is_last_two_swap, is_number, module_of, op_name, reduced_dims, single_use
from cudal1.rewrite.graph.rewrite import Rewrite
from cudal1.rewrite.graph.trace import is_constant, is_floating, ndim, reset_constant_memo, shape


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
        if isinstance(c, fx.Node) and is_constant(c) and ndim(c) == 2 and isinstance(x, fx.Node) \
                and not is_constant(x) and (ndim(x) or 0) >= 1:
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
    if name is None or not is_floating(node):
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
        nd = ndim(src)
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
        if f is not None and isinstance(f.root, fx.Node) and ndim(f.root):
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


FOLD_LINEAR = Rewrite("fold-linear", "fold consecutive affine maps and scalings into one linear map", fold_linear)
REDUCE_THROUGH_LINEAR = Rewrite("reduce-through-linear", "fold sum/mean over a linear map's outputs into its weights",
                                  reduce_through_linear)
