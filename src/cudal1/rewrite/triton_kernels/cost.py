"""Cost model of the ``triton-fusion`` pass: is one generated kernel expected to beat the eager ops?

Contract: :func:`estimate` gives (eager seconds, fused seconds) for a region from bytes moved and
launches only — each eager op reads its tensor operands and writes its result, the fused kernel
reads each input once and writes the output once; :func:`worth_fusing` says yes when the fused
estimate is lower and the region has at least two operations.  It does not model compute-bound
chains, caches, or what Inductor would do instead; the judge's timing has the last word.
"""

from __future__ import annotations

import math

import torch.fx as fx

from cudal1.rewrite.triton_kernels.codegen import DTYPES, Op, Region, tensor_meta

# Cost model (see worth_fusing), calibrated on the H200 (torch 2.11, Triton 3.6; 2026-11-30,
# tests/gpu/test_triton_fusion_gpu.py): host time of a tiny eager op 7.5 us, of a whole module
# forward with one tiny fused launch 24.7 us (of which ~5 us is the module call both versions
# pay); the fused 8192x8192 GELU chain of level1/88 moved 537 MB in 160 us (3.4 TB/s).  So a
# chain of three or more tiny eager ops is worth one launch; two are not.
BANDWIDTH_B_PER_S = 3.3e12  # sustained DRAM bandwidth of a simple elementwise kernel
EAGER_LAUNCH_S = 7.5e-6  # one eager elementwise operation: dispatch + launch
TRITON_LAUNCH_S = 20e-6  # one Triton launch from Python (argument binding + launch)


def _bytes(node: fx.Node) -> int:
    tm = tensor_meta(node)
    return math.prod(tm.shape) * DTYPES.get(tm.dtype, 4)


def estimate(region: Region, ops: dict[fx.Node, Op]) -> tuple[float, float]:
    """(eager seconds, fused seconds): each eager op reads its tensor operands and writes its
    result; the fused kernel reads each input once and writes the output once."""
    eager = 0.0
    for n in region.nodes:
        operands = {a for a in ops[n].operands if isinstance(a, fx.Node)}
        eager += EAGER_LAUNCH_S + (sum(_bytes(a) for a in operands) + _bytes(n)) / BANDWIDTH_B_PER_S
    fused_bytes = sum(_bytes(a) for a in region.full) + sum(_bytes(a) for a in region.broadcast) + _bytes(region.out)
    return eager, TRITON_LAUNCH_S + fused_bytes / BANDWIDTH_B_PER_S


def worth_fusing(region: Region, ops: dict[fx.Node, Op]) -> bool:
    eager, fused = estimate(region, ops)
    return len(region.nodes) >= 2 and fused < eager
