"""Graph pass ``matmul-chain``: re-parenthesise chains of 2-D matrix products by shape.

Contract (:data:`MATMUL_CHAIN`): a chain of three or more 2-D matrices whose intermediate products
are used nowhere else is re-ordered by the classic dynamic programme over its shapes (fewest
multiply-adds), when that saves at least 1.5x; the note states the FLOP ratio the programme
computed (e.g. 32.5x for the bundled ``examples/tasks/matmul_chain.py``: (1024³ + 1024²·16) /
(2·1024²·16)).  Rounding changes (another order of the same sums); the judge's exact-answer rule
accepts that.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from cudal1.rewrite.graph.emit import eliminate_dead_code
from cudal1.rewrite.graph.patterns import op_name, single_use
from cudal1.rewrite.graph.rewrite import Rewrite
from cudal1.rewrite.graph.trace import ndim, shape


def _chain_operands(node: fx.Node, top: bool = True) -> list[object]:
    if op_name(node) == "matmul" and len(node.args) == 2 and (top or single_use(node)) and all(
            ndim(a) == 2 for a in node.args if _chain_member(a)):
        if all(ndim(a) == 2 for a in node.args):
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
        if len(ops) < 3 or not all(ndim(o) == 2 for o in ops):
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

        def build(i: int, j: int, ops: list = ops, split: list = split) -> object:
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


MATMUL_CHAIN = Rewrite("matmul-chain", "re-parenthesise matrix chains by shape (fewest FLOPs)", matmul_chain)
