"""Graph pass ``triton-fusion``: chains of elementwise operations → one generated Triton kernel.

Contract: :func:`run` finds, in a traced task graph (shapes in ``node.meta["tensor_meta"]``, after
the algebraic passes), maximal single-output regions of elementwise operations — activations in
their ``torch.*``, ``F.*``, method and ``nn.Module`` spellings, and add/sub/mul/div/pow/minimum/
maximum — and replaces each region of at least two operations with one call to a generated
launcher ``_cudal1_fused_<i>`` that runs one ``@triton.jit`` kernel over the flattened output:
masked tail, ``BLOCK`` as a constexpr, fp32 math, output stored in the reference's dtype.

Operands of a region: tensors of the region's shape (read at the element's offset; they must be
contiguous in the trace and are made contiguous by the launcher), tensors broadcast along one
consecutive run of dims — a per-channel bias ``(C, 1, 1)``, a per-feature vector ``(N,)``, a
0-d scale — read at ``(offset // inner) % size`` with ``inner`` and ``size`` taken from the shapes
at run time, and Python numbers (written into the kernel).

The generated module-level source (imports, ``@triton.jit`` helpers, kernels and launchers; every
name prefixed ``_cudal1_``) is appended to ``gm.meta["cudal1_prelude"]`` (a list of source
strings) for the emitter; each new node is a ``call_function`` on the launcher object executed
from that same source, which on the meta device only allocates its output (shape propagation and
meta checks run it).  Which operations lower and how (formulas, ``tanh``'s overflow-free form) is
:mod:`cudal1.rewrite.triton_kernels.codegen`; whether a region is worth a kernel is
:mod:`cudal1.rewrite.triton_kernels.cost`; this module chooses the regions and edits the graph.

The pass declines a region (leaves it to PyTorch) when a shape or dtype is unknown, a dtype is not
fp16/bf16/fp32, a full-size input is not contiguous, a broadcast operand is not one run of dims,
the region depends only on parameters (the emitter precomputes those), an in-place operation
could be observed elsewhere, or the cost model (:func:`worth_fusing`) does not expect a gain.
Row reductions are not fused.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from cudal1.extras import is_available
from cudal1.rewrite.graph.emit import eliminate_dead_code
from cudal1.rewrite.graph.patterns import is_inplace, module_of
from cudal1.rewrite.graph.rewrite import Rewrite
from cudal1.rewrite.graph.trace import is_constant, reset_constant_memo, shape
from cudal1.rewrite.triton_kernels.codegen import (
    DTYPES,
    HEADER,
    HELPERS,
    Op,
    Region,
    exec_source,
    generate,
    recognise,
    tensor_meta,
)
from cudal1.rewrite.triton_kernels.conv_epilogue import split_biases, undo
from cudal1.rewrite.triton_kernels.cost import estimate, worth_fusing

NAME = "triton-fusion"
DESCRIPTION = ("fuse chains of elementwise operations (activations, scalar and per-channel arithmetic) "
               "into one Triton kernel")
PRELUDE_KEY = "cudal1_prelude"


# ---- regions -------------------------------------------------------------------------------------

def _dtype_ok(node: fx.Node) -> bool:
    tm = tensor_meta(node)
    return tm is not None and getattr(tm, "dtype", None) in DTYPES


def _contiguous(tm: Any) -> bool:
    expected = 1
    for size, stride in reversed(list(zip(tm.shape, tm.stride))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


# Producers whose output is a fresh tensor (not a view), so an in-place op on it is unobservable
# once it has no other user.
_FRESH_MODULES = ("Conv", "ConvTranspose", "Linear", "Bilinear", "BatchNorm", "GroupNorm", "LayerNorm", "InstanceNorm",
                  "MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool")


def _fresh(node: fx.Node, ops: dict[fx.Node, Op]) -> bool:
    if node in ops and not ops[node].inplace:
        return True
    if node.op == "call_module":
        return type(module_of(node)).__name__.startswith(_FRESH_MODULES)
    return node.op == "call_function" and node.target in (F.linear, torch.matmul, torch.mm, torch.bmm, F.conv1d,
                                                          F.conv2d, F.conv3d, torch.addmm)


def _inplace_ok(op: Op, ops: dict[fx.Node, Op]) -> bool:
    """An in-place op may run out of place when nothing else can see the tensor it overwrites."""
    if not op.inplace:
        return True
    target = op.operands[0]
    return isinstance(target, fx.Node) and len(target.users) == 1 and _fresh(target, ops)



def _broadcast_run(s: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, int] | None:
    """For an operand of shape ``s`` broadcast to ``out``: the output dims ``[a, k)`` it varies
    along (its element for output offset o is ``(o // prod(out[k:])) % numel``), or None when
    those dims are not one consecutive run (ignoring size-1 dims); ``(len(out), len(out))`` for a
    single element."""
    if len(s) > len(out):
        return None
    s = (1,) * (len(out) - len(s)) + tuple(s)
    kept = []
    for i, (a, b) in enumerate(zip(s, out)):
        if b == 1:
            continue
        if a == b:
            kept.append(i)
        elif a != 1:
            return None
    big = [i for i, b in enumerate(out) if b != 1]
    if not kept:
        return len(out), len(out)
    first, last = big.index(kept[0]), big.index(kept[-1])
    if big[first:last + 1] != kept:
        return None
    return kept[0], kept[-1] + 1


def _grow(sink: fx.Node, ops: dict[fx.Node, Op], taken: set[fx.Node]) -> list[fx.Node]:
    """The largest single-output region ending at ``sink``: operands whose every user is inside."""
    out_shape = shape(sink)
    region = {sink}
    changed = True
    while changed:
        changed = False
        for n in list(region):
            for a in ops[n].operands:
                if isinstance(a, fx.Node) and a not in region and a not in taken and a in ops \
                        and shape(a) == out_shape and all(u in region for u in a.users):
                    region.add(a)
                    changed = True
    order = {n: i for i, n in enumerate(sink.graph.nodes)}
    return sorted(region, key=order.__getitem__)


def _classify(nodes: list[fx.Node], ops: dict[fx.Node, Op]) -> Region | None:
    region = Region(nodes)
    out_shape = shape(region.out)
    inside = set(nodes)
    for n in nodes:
        for a in ops[n].operands:
            if not isinstance(a, fx.Node) or a in inside or a in region.full or a in region.broadcast:
                continue
            tm = tensor_meta(a)
            if tm is None or not _dtype_ok(a):
                return None
            if a.op == "get_attr" and str(a.target).startswith("_tensor_constant"):
                return None  # a tensor fx lifted out of forward: ModelNew would not have it
            s = tuple(tm.shape)
            if s == out_shape:
                if not _contiguous(tm):
                    return None
                region.full.append(a)
                continue
            run = _broadcast_run(s, out_shape)
            if run is None:
                return None
            region.broadcast[a] = (*run, math.prod(s))
    region.full.sort(key=lambda a: is_constant(a))  # an input (not a parameter) gives the launcher its output shape
    if not region.full or is_constant(region.full[0]):
        return None
    return region


def _mutation_between(region: Region) -> bool:
    """An in-place op outside the region between its first node and its output (the fused kernel
    reads its inputs at the output's position, later than the eager ops did)."""
    inside = set(region.nodes)
    started = False
    for n in region.out.graph.nodes:
        if n is region.nodes[0]:
            started = True
        if n is region.out:
            return False
        if started and n not in inside and n.op.startswith("call") and is_inplace(n):
            return True
    return False


def find_regions(gm: fx.GraphModule) -> tuple[list[Region], dict[fx.Node, Op]]:
    """Maximal fusible regions of ``gm`` (disjoint, in graph order) and every recognised op."""
    reset_constant_memo(gm.graph)
    ops: dict[fx.Node, Op] = {}
    for node in gm.graph.nodes:
        op = recognise(node)
        if op is not None and _dtype_ok(node) and shape(node) is not None and not is_constant(node):
            ops[node] = op
    ops = {n: op for n, op in ops.items() if _inplace_ok(op, ops)}
    regions, taken = [], set()
    for node in reversed(list(gm.graph.nodes)):
        if node not in ops or node in taken:
            continue
        nodes = _grow(node, ops, taken)
        taken |= set(nodes)
        if len(nodes) < 2 or math.prod(shape(node)) >= 2 ** 31:
            continue
        region = _classify(nodes, ops)
        if region is None or _mutation_between(region) or not worth_fusing(region, ops):
            continue
        regions.append(region)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    regions.sort(key=lambda r: order[r.out])
    return regions, ops


def run(gm: fx.GraphModule) -> list[str]:
    """The pass: fuse every worthwhile region; one note per fused region ([] when none)."""
    if not is_available("triton"):  # the pass declines where Triton is not installed
        return []
    splits = split_biases(gm)
    regions, ops = find_regions(gm)
    fused = {n for r in regions for n in r.nodes}
    for split in splits:
        if split.add not in fused:
            undo(split)
    if not regions:
        eliminate_dead_code(gm.graph)
        return []
    prelude: list[str] = gm.meta.setdefault(PRELUDE_KEY, [])
    start = sum(1 for src in prelude if "def _cudal1_fused_" in src)  # fresh names on a second run
    generated = [generate(r, ops, start + i) for i, r in enumerate(regions)]
    helpers = sorted(set().union(*(g.helpers for g in generated)))
    sources = [HEADER] + [HELPERS[h] for h in helpers] + [g.source for g in generated]
    namespace: dict[str, Any] = {"__name__": "_cudal1_triton_fusion"}
    for i, src in enumerate(sources):
        exec_source(src, namespace, str(i))
    for src in sources:
        if src not in prelude:
            prelude.append(src)
    graph, notes = gm.graph, []
    replaced: dict[fx.Node, fx.Node] = {}  # a region's output read by a later region: read the kernel's
    for region, gen in zip(regions, generated):
        with graph.inserting_before(region.out):
            args = tuple(replaced.get(a, a) for a in gen.args)
            new = graph.create_node("call_function", namespace[gen.name], args, {}, name="fused")
        new.meta = dict(region.out.meta)
        region.out.replace_all_uses_with(new)
        replaced[region.out] = new
        for n in reversed(region.nodes):  # in-place ops among them are not dead code to the DCE
            graph.erase_node(n)
        eager, fused_s = estimate(region, ops)
        moved = [s.label for s in splits if s.add in region.nodes]
        bias = f" (with the {moved[0]} bias, taken out of the convolution)" if moved else ""
        notes.append(f"{gen.note}{bias}, est. {eager * 1e6:.0f} → {fused_s * 1e6:.0f} µs")
    eliminate_dead_code(graph)
    return notes



TRITON_FUSION = Rewrite(NAME, DESCRIPTION, run)
