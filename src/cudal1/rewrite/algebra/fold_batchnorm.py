"""Graph pass ``fold-batchnorm``: a BatchNorm in eval mode folded into the convolution or linear map
before it.

Contract (:data:`FOLD_BATCHNORM`): ``bn(conv(x))`` with ``conv`` an ``nn.Conv1d/2d/3d``
(zero padding) and ``bn`` the matching ``nn.BatchNorm`` in eval mode with running statistics, or
``bn(linear(x))`` with an ``nn.Linear`` and a ``BatchNorm1d`` over its 2-D output, becomes one
``F.conv*d(x, W·s, (b - mean)·s + beta, ...)`` / ``F.linear`` with ``s = gamma / sqrt(var + eps)``,
built from the parameters and buffers as graph nodes (the emitter precomputes them in float64 and
recomputes them when any of them changes).  The convolution's output must be used by the
BatchNorm alone.

"Eval mode" is the module's ``training`` flag as the task built it (a task calling ``.eval()`` in
``__init__``); a model in training mode normalizes with batch statistics, which no fold can
reproduce, so the pass declines there.  Because a caller could still switch the model to training
mode later, the rewritten forward starts with a guard (``gm.meta["cudal1_eval_guards"]``: the
BatchNorm modules it checks) that runs the reference forward whenever one of them is training, and
the folded values are recomputed when the BatchNorm's batch counter moves (a training step updates
the running statistics in place without bumping their version counters).
"""

from __future__ import annotations

import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from cudal1.rewrite.graph.emit import eliminate_dead_code
from cudal1.rewrite.graph.patterns import module_of, single_use
from cudal1.rewrite.graph.rewrite import Rewrite
from cudal1.rewrite.graph.trace import ndim

GUARDS_KEY = "cudal1_eval_guards"
REFRESH_KEY = "cudal1_refresh_keys"  # read by the emitter: more buffers whose changes refresh folded values
_CONVS = {nn.Conv1d: (F.conv1d, nn.BatchNorm1d), nn.Conv2d: (F.conv2d, nn.BatchNorm2d),
          nn.Conv3d: (F.conv3d, nn.BatchNorm3d)}


def _foldable_bn(node: fx.Node) -> nn.Module | None:
    if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
        return None
    bn = module_of(node)
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm) or bn.training or not bn.track_running_stats \
            or bn.running_mean is None or bn.running_var is None:
        return None
    return bn


def _scale(graph: fx.Graph, bn_target: str, bn: nn.Module) -> tuple[fx.Node, fx.Node]:
    """(s, shift) nodes with bn(y) == y * s + shift per channel."""
    mean = graph.get_attr(f"{bn_target}.running_mean")
    var = graph.get_attr(f"{bn_target}.running_var")
    inv = graph.call_method("rsqrt", (graph.call_method("add", (var, float(bn.eps))),))
    s = graph.call_method("mul", (inv, graph.get_attr(f"{bn_target}.weight"))) if bn.affine else inv
    shift = graph.call_method("neg", (graph.call_method("mul", (mean, s)),))
    if bn.affine:
        shift = graph.call_method("add", (shift, graph.get_attr(f"{bn_target}.bias")))
    return s, shift


def run(gm: fx.GraphModule) -> list[str]:
    graph, notes = gm.graph, []
    guards: list[str] = gm.meta.setdefault(GUARDS_KEY, [])
    for node in list(graph.nodes):
        bn = _foldable_bn(node)
        if bn is None:
            continue
        prev = node.args[0]
        if not isinstance(prev, fx.Node) or prev.op != "call_module" or not single_use(prev) or len(prev.args) != 1 \
                or prev.kwargs:
            continue
        layer = module_of(prev)
        conv = _CONVS.get(type(layer))
        if conv is not None and isinstance(bn, conv[1]) and layer.padding_mode == "zeros":
            with graph.inserting_before(node):
                s, shift = _scale(graph, str(node.target), bn)
                w = graph.get_attr(f"{prev.target}.weight")
                view = (-1,) + (1,) * (len(layer.weight.shape) - 1)
                w = graph.call_method("mul", (w, graph.call_method("reshape", (s, view))))
                b = shift if layer.bias is None else graph.call_method(
                    "add", (graph.call_method("mul", (graph.get_attr(f"{prev.target}.bias"), s)), shift))
                new = graph.call_function(conv[0], (prev.args[0], w, b, layer.stride, layer.padding, layer.dilation,
                                                    layer.groups))
            what = f"{type(layer).__name__} → {type(bn).__name__}"
        elif isinstance(layer, nn.Linear) and isinstance(bn, nn.BatchNorm1d) and ndim(prev) == 2:
            with graph.inserting_before(node):
                s, shift = _scale(graph, str(node.target), bn)
                w = graph.call_method("mul", (graph.get_attr(f"{prev.target}.weight"),
                                              graph.call_method("unsqueeze", (s, -1))))
                b = shift if layer.bias is None else graph.call_method(
                    "add", (graph.call_method("mul", (graph.get_attr(f"{prev.target}.bias"), s)), shift))
                new = graph.call_function(F.linear, (prev.args[0], w, b))
            what = "Linear → BatchNorm1d"
        else:
            continue
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)  # a BatchNorm call is stateful (running stats): dead-code removal keeps it
        graph.erase_node(prev)
        guards.append(str(node.target))
        gm.meta.setdefault(REFRESH_KEY, []).append(f"{node.target}.num_batches_tracked")
        notes.append(f"{what} (eval mode): the normalization folded into the weights and bias")
    eliminate_dead_code(graph)
    return notes


FOLD_BATCHNORM = Rewrite("fold-batchnorm", "fold an eval-mode BatchNorm into the convolution or linear map before it",
                           run)
