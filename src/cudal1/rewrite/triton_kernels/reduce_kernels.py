"""Triton kernels for softmax, normalizations and reductions (cudal1's ``triton-reduce`` pass).

This file is embedded verbatim in the candidates the pass writes (so it imports nothing from
cudal1); every launcher computes exactly what the PyTorch call it replaces computes, in fp32
arithmetic, and stores the result in the input's dtype:

- ``_cudal1_softmax(x, dim, log)``: softmax / log_softmax over the last dim;
- ``_cudal1_norm(x, rows_of, weight, bias, eps, rms, groups, channels_per_group, spatial)``:
  LayerNorm, RMSNorm, GroupNorm and InstanceNorm as one row normalization (mean and variance in
  two passes, or the mean square), with the affine weight and bias read per element, per feature
  or per channel;
- ``_cudal1_reduce(x, dim, op, keepdim)``: sum, mean, amax, amin, argmax, argmin over one dim
  (max and min propagate NaN; argmax/argmin take the first occurrence and rank NaN highest, as
  torch does).

Rows that fit in registers (up to ``_CUDAL1_ONE_PASS`` elements) are read once; longer rows are
read in blocks, twice or three times.  Launch configurations (warps, blocks) are autotuned per
shape on the GPU; Triton's CPU interpreter (the CPU tests) runs one fixed configuration.  Any
input the kernels do not take (other dtypes or devices, empty tensors) goes to PyTorch itself; on
the meta device only shapes are computed.
"""

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

_CUDAL1_ONE_PASS = 16384  # longest row kept in registers (one read)
_CUDAL1_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _cudal1_interpreted():
    return os.environ.get("TRITON_INTERPRET") == "1"


def _cudal1_takes(*tensors):
    """Whether the kernels take these tensors: float32/16/bf16, non-empty, on CUDA (or on the CPU
    under Triton's interpreter)."""
    return all(t.dtype in _CUDAL1_FLOATS and t.numel() > 0 for t in tensors) and (
        all(t.is_cuda for t in tensors) or (_cudal1_interpreted() and all(t.device.type == "cpu" for t in tensors)))


def _cudal1_launch(kernel, tuned, grid, args, fixed, interpreted_config):
    """Run ``tuned`` (autotuned over the rest of the configuration), or under the interpreter
    ``kernel`` with ``interpreted_config``; ``fixed``: constexpr arguments of every launch."""
    if _cudal1_interpreted():
        kernel[grid](*args, **fixed, **interpreted_config)
    else:
        tuned[grid](*args, **fixed)


def _cudal1_warps(*warps):
    return [triton.Config({}, num_warps=w) for w in warps]


# ---- softmax over contiguous rows ------------------------------------------------------------------

@triton.jit
def _cudal1_softmax_kernel(x_ptr, y_ptr, R, LOG: tl.constexpr, ONE: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row of length R: max and sum of exponentials (online across blocks), then
    exp(x - max) / sum or x - max - log(sum)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * R
    y_row = y_ptr + row * R
    cols = tl.arange(0, BLOCK)
    if ONE:
        mask = cols < R
        x = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m = tl.max(x, 0)
        e = tl.where(mask, tl.exp(x - m), 0.0)
        s = tl.sum(e, 0)
        if LOG:
            y = x - m - tl.log(s)
        else:
            y = e / s
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        m_v = tl.full([BLOCK], float("-inf"), tl.float32)
        s_v = tl.zeros([BLOCK], tl.float32)
        for start in range(0, R, BLOCK):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < R, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m_v, x)
            alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m_v - m_new))
            p = tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
            s_v = s_v * alpha + p
            m_v = m_new
        m = tl.max(m_v, 0)
        s = tl.sum(tl.where(m_v == float("-inf"), 0.0, s_v * tl.exp(m_v - m)), 0)
        for start in range(0, R, BLOCK):
            offs = start + cols
            mask = offs < R
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            if LOG:
                y = x - m - tl.log(s)
            else:
                y = tl.exp(x - m) / s
            tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


_cudal1_softmax_one = triton.autotune(_cudal1_warps(2, 4, 8, 16), key=["R"])(_cudal1_softmax_kernel)
_cudal1_softmax_blocks = triton.autotune(
    [triton.Config({"BLOCK": b}, num_warps=w) for b in (2048, 4096, 8192) for w in (8, 16)], key=["R"])(
    _cudal1_softmax_kernel)


def _cudal1_softmax(x, dim, log=False):
    """F.softmax(x, dim) (``log``: F.log_softmax) for the last dim."""
    if x.dim() == 0 or dim % x.dim() != x.dim() - 1 or not _cudal1_takes(x):
        return F.log_softmax(x, dim) if log else F.softmax(x, dim)
    x = x.contiguous()
    y = torch.empty_like(x)
    r = x.shape[-1]
    grid = (x.numel() // r,)
    if r <= _CUDAL1_ONE_PASS:
        block = triton.next_power_of_2(r)
        _cudal1_launch(_cudal1_softmax_kernel, _cudal1_softmax_one, grid, (x, y, r),
                       {"LOG": log, "ONE": True, "BLOCK": block}, {})
    else:
        _cudal1_launch(_cudal1_softmax_kernel, _cudal1_softmax_blocks, grid, (x, y, r), {"LOG": log, "ONE": False},
                       {"BLOCK": 1024})
    return y


# ---- row normalization (LayerNorm, RMSNorm, GroupNorm, InstanceNorm) --------------------------------

@triton.jit
def _cudal1_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, R, eps, G, CPG, S, RMS: tl.constexpr, HAS_W: tl.constexpr,
                        HAS_B: tl.constexpr, ONE: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row of length R: y = (x - mean) / sqrt(var + eps) (RMS: x / sqrt(mean(x²) +
    eps)), times weight[c] plus bias[c] with c = (row % G) * CPG + col // S."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * R
    y_row = y_ptr + row * R
    wbase = (row % G) * CPG
    cols = tl.arange(0, BLOCK)
    if ONE:
        mask = cols < R
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if RMS:
            d = x
            rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, 0) / R + eps)
        else:
            d = tl.where(mask, x - tl.sum(x, 0) / R, 0.0)
            rstd = 1.0 / tl.sqrt_rn(tl.sum(d * d, 0) / R + eps)
        y = d * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + wbase + cols // S, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + wbase + cols // S, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, R, BLOCK):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < R, other=0.0).to(tl.float32)
            if RMS:
                acc += x * x
            else:
                acc += x
        mean = tl.sum(acc, 0) / R
        if RMS:
            rstd = 1.0 / tl.sqrt_rn(mean + eps)
            mean = 0.0
        else:
            acc = tl.zeros([BLOCK], tl.float32)
            for start in range(0, R, BLOCK):
                offs = start + cols
                x = tl.load(x_row + offs, mask=offs < R, other=0.0).to(tl.float32)
                d = tl.where(offs < R, x - mean, 0.0)
                acc += d * d
            rstd = 1.0 / tl.sqrt_rn(tl.sum(acc, 0) / R + eps)
        for start in range(0, R, BLOCK):
            offs = start + cols
            mask = offs < R
            y = (tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) - mean) * rstd
            if HAS_W:
                y = y * tl.load(w_ptr + wbase + offs // S, mask=mask, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(b_ptr + wbase + offs // S, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


_cudal1_norm_one = triton.autotune(_cudal1_warps(2, 4, 8, 16), key=["R"])(_cudal1_norm_kernel)
_cudal1_norm_blocks = triton.autotune(
    [triton.Config({"BLOCK": b}, num_warps=w) for b in (2048, 4096, 8192) for w in (8, 16)], key=["R"])(
    _cudal1_norm_kernel)


def _cudal1_norm(x, row_numel, weight, bias, eps, rms=False, groups=1, channels_per_group=None, spatial=1):
    """Normalize x (contiguous) over consecutive rows of ``row_numel`` elements.  The affine
    parameters of element ``col`` of row ``r`` are at ``(r % groups) * channels_per_group + col //
    spatial`` (LayerNorm/RMSNorm: groups 1, spatial 1; GroupNorm: groups G, spatial H*W...;
    InstanceNorm: groups C, one channel per group).  None when the kernels do not take ``x``: the
    caller then runs PyTorch."""
    tensors = [t for t in (x, weight, bias) if t is not None]
    if not _cudal1_takes(*tensors) or x.numel() % row_numel:
        return None
    x = x.contiguous()
    y = torch.empty_like(x)
    w = weight.contiguous() if weight is not None else y
    b = bias.contiguous() if bias is not None else y
    cpg = row_numel if channels_per_group is None else channels_per_group
    args = (x, w, b, y, row_numel, float(eps), groups, cpg, spatial)
    fixed = {"RMS": rms, "HAS_W": weight is not None, "HAS_B": bias is not None}
    grid = (x.numel() // row_numel,)
    if row_numel <= _CUDAL1_ONE_PASS:
        _cudal1_launch(_cudal1_norm_kernel, _cudal1_norm_one, grid, args,
                       {**fixed, "ONE": True, "BLOCK": triton.next_power_of_2(row_numel)}, {})
    else:
        _cudal1_launch(_cudal1_norm_kernel, _cudal1_norm_blocks, grid, args, {**fixed, "ONE": False}, {"BLOCK": 1024})
    return y


def _cudal1_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """F.layer_norm."""
    n = 1
    for d in normalized_shape:
        n *= d
    y = _cudal1_norm(x, n, weight, bias, eps) if x.device.type != "meta" else None
    return y if y is not None else F.layer_norm(x, normalized_shape, weight, bias, eps)


def _cudal1_rms_norm(x, normalized_shape, weight=None, eps=None):
    """F.rms_norm (eps None: the dtype's machine epsilon, as PyTorch)."""
    n = 1
    for d in normalized_shape:
        n *= d
    e = torch.finfo(x.dtype).eps if eps is None else eps
    y = _cudal1_norm(x, n, weight, None, e, rms=True) if x.device.type != "meta" else None
    return y if y is not None else F.rms_norm(x, normalized_shape, weight, eps)


def _cudal1_group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """F.group_norm for x (N, C, *): rows are (sample, group) blocks of C/G channels."""
    if x.device.type != "meta" and x.dim() >= 2 and x.shape[1] % num_groups == 0:
        spatial = x[0, 0].numel()
        cpg = x.shape[1] // num_groups
        y = _cudal1_norm(x, cpg * spatial, weight, bias, eps, groups=num_groups, channels_per_group=cpg,
                         spatial=spatial)
        if y is not None:
            return y
    return F.group_norm(x, num_groups, weight, bias, eps)


def _cudal1_instance_norm(x, weight=None, bias=None, eps=1e-5):
    """F.instance_norm with the instance's own statistics (no running stats) for x (N, C, *)."""
    if x.device.type != "meta" and x.dim() >= 3:
        y = _cudal1_norm(x, x[0, 0].numel(), weight, bias, eps, groups=x.shape[1], channels_per_group=1,
                         spatial=x[0, 0].numel())
        if y is not None:
            return y
    return F.instance_norm(x, weight=weight, bias=bias, eps=eps)


# ---- reductions over one dim: x viewed as [outer, R, inner] --------------------------------------

@triton.jit
def _cudal1_argmax_combine(v1, i1, v2, i2):
    """The larger value (NaN ranks highest), the smaller index on ties: torch's argmax order."""
    n1 = v1 != v1
    n2 = v2 != v2
    tie = (v1 == v2) | (n1 & n2)
    take = (n2 & ~n1) | ((n1 == n2) & ((v2 > v1) | (tie & (i2 < i1))))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)


@triton.jit
def _cudal1_maximum(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _cudal1_reduce_kernel(x_ptr, y_ptr, R, INNER, OP: tl.constexpr, NEG: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_I: tl.constexpr):
    """Program (o, i-block) reduces x[o, :, i-block] over R.  OP: 0 sum, 1 mean, 2 max, 4 argmax;
    NEG: reduce -x (min and argmin are max and argmax of -x)."""
    outer = tl.program_id(0).to(tl.int64)
    offs_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    base = x_ptr + outer * R * INNER
    rr = tl.arange(0, BLOCK_R)
    if OP <= 1:
        acc = tl.zeros([BLOCK_R, BLOCK_I], tl.float32)
    else:
        acc = tl.full([BLOCK_R, BLOCK_I], float("-inf"), tl.float32)
    idx = tl.zeros([BLOCK_R, BLOCK_I], tl.int32)
    for start in range(0, R, BLOCK_R):
        r = start + rr
        mask = (r[:, None] < R) & (offs_i[None, :] < INNER)
        ptrs = base + r[:, None].to(tl.int64) * INNER + offs_i[None, :]
        if OP <= 1:
            acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        else:
            v = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            if NEG:
                v = -v
            v = tl.where(mask, v, float("-inf"))
            if OP == 2:
                acc = _cudal1_maximum(acc, v)
            else:
                here = r[:, None] + tl.zeros([BLOCK_R, BLOCK_I], tl.int32)
                acc, idx = _cudal1_argmax_combine(acc, idx, v, tl.where(mask, here, R))
    out_ptrs = y_ptr + outer * INNER + offs_i
    keep = offs_i < INNER
    if OP <= 1:
        total = tl.sum(acc, 0)
        if OP == 1:
            total = total / R
        tl.store(out_ptrs, total.to(y_ptr.dtype.element_ty), mask=keep)
    elif OP == 2:
        best = tl.reduce(acc, 0, _cudal1_maximum)
        if NEG:
            best = -best
        tl.store(out_ptrs, best.to(y_ptr.dtype.element_ty), mask=keep)
    else:
        _, where = tl.reduce((acc, idx), 0, _cudal1_argmax_combine)
        tl.store(out_ptrs, where.to(tl.int64), mask=keep)


_cudal1_reduce_rows = triton.autotune(
    [triton.Config({"BLOCK_R": b, "BLOCK_I": 1}, num_warps=w) for b in (512, 1024, 4096) for w in (4, 8)],
    key=["R", "INNER"])(_cudal1_reduce_kernel)
_cudal1_reduce_columns = triton.autotune(
    [triton.Config({"BLOCK_R": r, "BLOCK_I": i}, num_warps=w) for r, i in ((4, 256), (16, 128), (32, 64), (64, 32))
     for w in (4, 8)], key=["R", "INNER"])(_cudal1_reduce_kernel)
_CUDAL1_REDUCE_OPS = {"sum": (0, False, torch.sum), "mean": (1, False, torch.mean), "amax": (2, False, torch.amax),
                      "amin": (2, True, torch.amin), "argmax": (4, False, torch.argmax),
                      "argmin": (4, True, torch.argmin)}


def _cudal1_reduce(x, dim, op, keepdim=False):
    """torch.<op>(x, dim, keepdim) for op in sum, mean, amax, amin, argmax, argmin (one dim)."""
    code, neg, torch_op = _CUDAL1_REDUCE_OPS[op]
    if x.dim() == 0 or not _cudal1_takes(x):
        return torch_op(x, dim, keepdim=keepdim)
    d = dim % x.dim()
    x = x.contiguous()
    r = x.shape[d]
    inner = x[(0,) * (d + 1)].numel() if d + 1 < x.dim() else 1
    outer = x.numel() // (r * inner)
    shape = list(x.shape)
    shape[d] = 1
    y = torch.empty(shape, dtype=torch.int64 if code >= 4 else x.dtype, device=x.device)
    fixed = {"OP": code, "NEG": neg}
    if inner == 1:
        _cudal1_launch(_cudal1_reduce_kernel, _cudal1_reduce_rows, (outer, 1), (x, y, r, inner), fixed,
                       {"BLOCK_R": 256, "BLOCK_I": 1})
    else:
        def grid(meta):
            return (outer, triton.cdiv(inner, meta["BLOCK_I"]))

        _cudal1_launch(_cudal1_reduce_kernel, _cudal1_reduce_columns, grid, (x, y, r, inner), fixed,
                       {"BLOCK_R": 16, "BLOCK_I": 32})
    return y if keepdim else y.squeeze(d)
