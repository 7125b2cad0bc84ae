"""Graph pass ``gemm-3xtf32``: fp32 matrix products as one generated Triton kernel with
split-precision tensor-core math.

Contract: :func:`run` replaces, in a traced task graph (shapes in ``node.meta["tensor_meta"]``,
after the algebraic passes), every fp32 ``matmul``/``mm``/``bmm``/``@`` of two operands with at
least two dims (equal batch dims, or one side a plain matrix), every fp32 ``nn.Linear`` /
``F.linear`` and every one-group, zero-padded fp32 ``nn.Conv2d`` / ``F.conv2d`` with a call to a
launcher of :mod:`cudal1.rewrite.triton_kernels.gemm_kernels` (its source appended once to
``gm.meta["cudal1_prelude"]``; every name prefixed ``_cudal1_``).  Sites
smaller than :data:`MIN_MACS` multiply-adds are left to cuBLAS/cuDNN (launch cost dominates there).

Numerics: the kernel computes ``tl.dot(a, b, acc, input_precision="tf32x3")``: each operand is
split into a TF32 high part and a TF32 low part and three tensor-core products are summed in fp32
(the low x low term is dropped), so the error stays at the level of an fp32 product, which the
judge's exact-answer rule checks like any other candidate.  Nothing global changes: TF32 stays off
for every other operation, and a plain TF32 or bf16 product would still fail that rule.

The launchers run the kernel only on CUDA tensors (or under ``TRITON_INTERPRET=1``, which the CPU
tests use); anything else — other dtypes, devices, empty or unexpected shapes, more than 65 535
batches — is computed by PyTorch as the reference does.  On the meta device they only compute
shapes.  Tile shapes are autotuned per problem size on the first call.  Not taken: grouped or
depthwise, transposed, 1-D and 3-D convolutions.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from cudal1.extras import is_available
from cudal1.rewrite.graph.emit import eliminate_dead_code
from cudal1.rewrite.graph.patterns import arg, module_of, op_name
from cudal1.rewrite.graph.rewrite import Rewrite
from cudal1.rewrite.graph.trace import dtype, is_constant, reset_constant_memo, shape
from cudal1.rewrite.triton_kernels.codegen import exec_source
from cudal1.rewrite.triton_kernels.fusion import PRELUDE_KEY

NAME = "gemm-3xtf32"
DESCRIPTION = ("fp32 matrix products and 2-D convolutions as generated Triton kernels with split-precision (3xTF32) "
               "tensor-core math")
MIN_MACS = 1 << 21  # below ~128^3 multiply-adds cuBLAS's launch path is already the fast one

KERNELS = Path(__file__).with_name("gemm_kernels.py")


def _fp32(node: Any) -> bool:
    return isinstance(node, fx.Node) and dtype(node) == torch.float32 and shape(node) is not None


def _macs_matmul(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """Multiply-adds of ``a @ b`` when the launcher's kernel path takes these shapes, else None."""
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    if len(b) > 2 and len(a) > 2 and a[:-2] != b[:-2]:
        return None
    batch = math.prod(a[:-2]) if len(b) == 2 or len(a) > 2 else math.prod(b[:-2])
    return batch * a[-2] * a[-1] * b[-1]


def _site(graph: fx.Graph, node: fx.Node) -> tuple[str, tuple, str] | None:
    """(launcher, its arguments, note) for a node the pass takes, else None."""
    name = op_name(node)
    if name == "matmul" and len(node.args) == 2 and not node.kwargs:
        a, b = node.args
        if not (_fp32(a) and _fp32(b) and _fp32(node)) or is_constant(node):
            return None
        macs = _macs_matmul(shape(a), shape(b))
        if macs is None or macs < MIN_MACS:
            return None
        return "_cudal1_matmul", (a, b), f"{'x'.join(map(str, shape(a)))} @ {'x'.join(map(str, shape(b)))}"
    conv = _conv2d(graph, node)
    if conv is not None:
        return conv
    if name in ("Linear", "linear"):
        if name == "Linear":
            x = node.args[0] if len(node.args) == 1 and not node.kwargs else None
            w = graph.get_attr(f"{node.target}.weight") if x is not None else None
            b = graph.get_attr(f"{node.target}.bias") if x is not None and module_of(node).bias is not None else None
        else:
            x, w, b = node.args[0], arg(node, 1, "weight"), arg(node, 2, "bias")
        if not (_fp32(x) and _fp32(node)) or not isinstance(w, fx.Node) or is_constant(node):
            return None
        s, n_out = shape(x), shape(node)[-1]
        if not s or s[-1] * math.prod(s[:-1]) * n_out < MIN_MACS:
            return None
        return "_cudal1_linear", (x, w) + ((b,) if b is not None else ()), \
            f"linear {'x'.join(map(str, s))} → {n_out}"
    return None


def _conv2d(graph: fx.Graph, node: fx.Node) -> tuple[str, tuple, str] | None:
    """A one-group, zero-padded fp32 ``nn.Conv2d`` / ``F.conv2d`` as ``_cudal1_conv2d``'s site."""
    if node.op == "call_module" and isinstance(module_of(node), torch.nn.Conv2d):
        mod = module_of(node)
        if len(node.args) != 1 or node.kwargs or mod.groups != 1 or mod.padding_mode != "zeros":
            return None
        x, w = node.args[0], graph.get_attr(f"{node.target}.weight")
        b = graph.get_attr(f"{node.target}.bias") if mod.bias is not None else None
        stride, padding, dilation, shape_w = mod.stride, mod.padding, mod.dilation, tuple(mod.weight.shape)
    elif node.op == "call_function" and node.target is torch.nn.functional.conv2d:
        x, w, b = node.args[0], arg(node, 1, "weight"), arg(node, 2, "bias")
        stride, padding, dilation = arg(node, 3, "stride", 1), arg(node, 4, "padding", 0), arg(node, 5, "dilation", 1)
        if arg(node, 6, "groups", 1) != 1 or not isinstance(w, fx.Node) or shape(w) is None:
            return None
        shape_w = shape(w)
    else:
        return None
    if padding == "valid":
        padding = 0
    if isinstance(padding, str) or not (_fp32(x) and _fp32(node)) or is_constant(node) or len(shape(x)) != 4 \
            or (b is not None and not isinstance(b, fx.Node)):
        return None
    out = shape(node)
    macs = out[0] * out[2] * out[3] * math.prod(shape_w)
    if macs < MIN_MACS:
        return None
    return "_cudal1_conv2d", (x, w, b, stride, padding, dilation), \
        f"conv2d {'x'.join(map(str, shape(x)))} * {'x'.join(map(str, shape_w))}"


def run(gm: fx.GraphModule) -> list[str]:
    """The pass: every fp32 product worth it → a 3xTF32 Triton launcher; one note per site."""
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
            site = _site(graph, node)
        if site is None:
            continue
        if not namespace:
            namespace["__name__"] = "_cudal1_triton_gemm"
            exec_source(KERNELS.read_text(), namespace, "gemm")
        launcher, args, what = site
        with graph.inserting_before(node):
            new = graph.create_node("call_function", namespace[launcher], args, {}, name="gemm")
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        notes.append(f"{what} (fp32) → one Triton GEMM in split-precision 3xTF32 tensor-core math "
                     f"({launcher.removeprefix('_cudal1_')}, autotuned tiles)")
    if notes:
        prelude: list[str] = gm.meta.setdefault(PRELUDE_KEY, [])
        source = KERNELS.read_text()
        if source not in prelude:
            prelude.append(source)
    eliminate_dead_code(graph)  # the replaced nodes, and get_attr nodes made while looking
    return notes


GEMM_3XTF32 = Rewrite(NAME, DESCRIPTION, run)
