"""Graph pass ``diag-broadcast``: ``diag(v) @ M → v[:, None] * M`` and ``M @ diag(v) → M * v``.

Contract (:data:`DIAG_BROADCAST`): only for a 1-D ``v`` (``diag`` of a matrix extracts a diagonal
and is left alone) and a matrix operand of at least two dims; the dense diagonal matrix is never
built, so the O(N²M) product becomes O(NM) work.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from cudal1.rewrite.graph.emit import eliminate_dead_code
from cudal1.rewrite.graph.patterns import arg, op_name
from cudal1.rewrite.graph.rewrite import Rewrite
from cudal1.rewrite.graph.trace import ndim, shape


def _diag_vector(node: object) -> fx.Node | None:
    if isinstance(node, fx.Node) and op_name(node) == "diag" and ndim(node.args[0]) == 1 and \
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
        if va is not None and vb is None and isinstance(b, fx.Node) and (ndim(b) or 0) >= 2:
            with graph.inserting_before(node):
                col = graph.call_method("unsqueeze", (va, -1))
                new = graph.call_function(operator.mul, (col, b))
            notes.append(f"diag(v) @ M → v[:, None] * M ({shape(a)[0]}x{shape(a)[0]} diagonal matrix never built)")
        elif vb is not None and va is None and isinstance(a, fx.Node) and (ndim(a) or 0) >= 2:
            with graph.inserting_before(node):
                new = graph.call_function(operator.mul, (a, vb))
            notes.append(f"M @ diag(v) → M * v ({shape(b)[0]}x{shape(b)[0]} diagonal matrix never built)")
        else:
            continue
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
    eliminate_dead_code(graph)
    return notes


DIAG_BROADCAST = Rewrite("diag-broadcast", "diag(v) @ M → v[:, None] * M (no dense diagonal matrix)", diag_broadcast)
