"""The convolution bias as part of a fused epilogue (used by the ``triton-fusion`` pass).

Contract: :func:`split_biases` rewrites each ``nn.Conv1d/2d/3d`` or ``nn.ConvTranspose1d/2d/3d``
call (zero padding, with a bias) whose only user is an elementwise operation the Triton fusion
recognises into the convolution without its bias, followed by ``+ bias`` broadcast over the channel
dim — exactly what PyTorch computes, where the bias add is a separate kernel after cuDNN's — so
that the bias joins the elementwise chain in one generated kernel (conv + bias + activation in
two launches instead of three).  Shapes of the new nodes are recorded as the pass needs them.
:func:`undo` puts a bias back into its convolution when no fused region took the add.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from cudal1.rewrite.graph.patterns import module_of
from cudal1.rewrite.triton_kernels.codegen import DTYPES, recognise, tensor_meta

_FUNCTIONAL = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d, nn.ConvTranspose1d: F.conv_transpose1d,
               nn.ConvTranspose2d: F.conv_transpose2d, nn.ConvTranspose3d: F.conv_transpose3d}


@dataclass
class Split:
    conv: fx.Node  # the functional convolution, bias None
    bias: fx.Node  # get_attr of the module's bias
    add: fx.Node  # conv + bias.view(C, 1, ...)
    label: str  # e.g. "Conv2d"


def _meta(node: fx.Node, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    node.meta["tensor_meta"] = _extract_tensor_metadata(torch.empty(shape, dtype=dtype, device="meta"))


def split_biases(gm: fx.GraphModule) -> list[Split]:
    graph, splits = gm.graph, []
    for node in list(graph.nodes):
        if node.op != "call_module" or len(node.args) != 1 or node.kwargs or len(node.users) != 1:
            continue
        mod = module_of(node)
        fn = _FUNCTIONAL.get(type(mod))
        tm = tensor_meta(node)
        if fn is None or mod.bias is None or mod.padding_mode != "zeros" or tm is None or tm.dtype not in DTYPES:
            continue
        if recognise(next(iter(node.users))) is None:
            continue
        channels, rank = mod.bias.shape[0], len(tm.shape)
        with graph.inserting_before(node):
            weight = graph.get_attr(f"{node.target}.weight")
            bias = graph.get_attr(f"{node.target}.bias")
            if isinstance(mod, nn.modules.conv._ConvTransposeNd):
                args = (node.args[0], weight, None, mod.stride, mod.padding, mod.output_padding, mod.groups,
                        mod.dilation)
            else:
                args = (node.args[0], weight, None, mod.stride, mod.padding, mod.dilation, mod.groups)
            conv = graph.call_function(fn, args)
            view = graph.create_node("call_method", "view", (bias, (-1,) + (1,) * (rank - 2)), {},
                                     name=f"{node.name}_bias_per_channel")
            add = graph.call_function(operator.add, (conv, view))
        conv.meta, add.meta = dict(node.meta), dict(node.meta)
        _meta(weight, tuple(mod.weight.shape), tm.dtype)
        _meta(bias, (channels,), tm.dtype)
        _meta(view, (channels,) + (1,) * (rank - 2), tm.dtype)
        node.replace_all_uses_with(add)
        graph.erase_node(node)
        splits.append(Split(conv, bias, add, type(mod).__name__))
    return splits


def undo(split: Split) -> None:
    """The bias back into the convolution (the add and the view are left without users)."""
    split.conv.update_arg(2, split.bias)
    split.add.replace_all_uses_with(split.conv)
