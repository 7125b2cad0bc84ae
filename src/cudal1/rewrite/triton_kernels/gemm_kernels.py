"""Triton kernels for fp32 matrix products and 2-D convolutions in split-precision tensor-core math
(cudal1's ``gemm-3xtf32`` pass).

This file is embedded verbatim in the candidates the pass writes (so it imports nothing from
cudal1).  Each product is ``tl.dot(a, b, acc, input_precision="tf32x3")``: both operands split into
a TF32 high part and a TF32 low part, three tensor-core products summed in fp32 (low x low
dropped), so the error stays at an fp32 product's level.  Launchers:

- ``_cudal1_matmul(a, b)``: ``torch.matmul`` for (..., M, K) @ (K, N) or equal batch dims;
- ``_cudal1_linear(x, weight, bias)``: ``F.linear``, the weight read through its transposed strides;
- ``_cudal1_conv2d(x, weight, bias, stride, padding, dilation)``: ``F.conv2d`` with one group, as an
  implicit GEMM (rows: output pixels, columns: output channels, reduction: input channel x kernel
  window; the input gathered per tile, zero padding by masking).

They run the kernels on CUDA tensors (or under ``TRITON_INTERPRET=1``, the CPU tests); anything
else — other dtypes or devices, empty or unexpected shapes, more than 65 535 batches — is computed
by PyTorch itself, and on the meta device only shapes are.  Tile shapes are autotuned per problem
size on the first call.
"""

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


def _cudal1_gemm_configs():
    """Tile shapes tried on the first call per (M, N, K): large tiles for large products, small ones
    for thin or small matrices (fp32 tiles take twice the shared memory of fp16 ones)."""
    shapes = [(128, 128, 32, 3, 8), (128, 256, 32, 3, 8), (256, 128, 32, 3, 8), (128, 64, 32, 4, 4),
              (64, 128, 32, 4, 4), (64, 64, 32, 4, 4), (64, 64, 64, 3, 4), (32, 64, 32, 4, 4)]
    return [triton.Config({"BM": m, "BN": n, "BK": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
            for m, n, k, s, w in shapes]


@triton.jit
def _cudal1_gemm_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn,
                        HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        GROUP_M: tl.constexpr):
    """C[b] = A[b] @ B[b] (+ bias along N) in fp32, each product in 3xTF32 (fp32-accurate)."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    tiles_m = (M + BM - 1) // BM
    tiles_n = (N + BN - 1) // BN
    # tiles in groups of GROUP_M rows, so neighbouring programs share A rows and B columns in L2
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pm = first_m + (pid % per_group) % rows
    pn = (pid % per_group) // rows
    rm = (pm * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (pn * BN + tl.arange(0, BN)).to(tl.int64)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + batch * s_ab + rm[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + batch * s_bb + rk[:, None] * s_bk + rn[None, :] * s_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, (K + BK - 1) // BK):
        left = K - k * BK
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="tf32x3")
        a_ptrs += BK * s_ak
        b_ptrs += BK * s_bk
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
    c_ptrs = c_ptr + batch * s_cb + rm[:, None] * s_cm + rn[None, :] * s_cn
    tl.store(c_ptrs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


# Autotuned on the GPU; Triton's CPU interpreter (the CPU tests) cannot time, so it runs one tile shape.
_cudal1_gemm_tuned = triton.autotune(configs=_cudal1_gemm_configs(), key=["M", "N", "K"])(_cudal1_gemm_kernel)


def _cudal1_interpreted():
    return os.environ.get("TRITON_INTERPRET") == "1"


def _cudal1_gemm_runs(*tensors):
    """Whether the Triton kernel takes these tensors (fp32, on CUDA or in Triton's interpreter)."""
    return all(t.dtype == torch.float32 for t in tensors) and all(t.numel() > 0 for t in tensors) and (
        all(t.is_cuda for t in tensors) or (_cudal1_interpreted() and all(t.device.type == "cpu" for t in tensors)))


def _cudal1_gemm(a, b, bias=None):
    """a (B, M, K) @ b (B or 1, K, N) + bias (N,) as a new (B, M, N) fp32 tensor; a batch of one
    in b is broadcast (stride 0)."""
    nb, m, k = a.shape
    n = b.shape[2]
    out = torch.empty((nb, m, n), dtype=torch.float32, device=a.device)
    s_bb = b.stride(0) if b.shape[0] > 1 else 0

    def grid(meta):
        return (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]), nb)

    args = (a, b, bias if bias is not None else out, out, m, n, k, a.stride(0), a.stride(1), a.stride(2), s_bb,
            b.stride(1), b.stride(2), out.stride(0), out.stride(1), out.stride(2))
    if _cudal1_interpreted():
        _cudal1_gemm_kernel[grid](*args, HAS_BIAS=bias is not None, BM=32, BN=32, BK=16, GROUP_M=4)
    else:
        _cudal1_gemm_tuned[grid](*args, HAS_BIAS=bias is not None)
    return out


def _cudal1_matmul(a, b):
    """torch.matmul(a, b) for a (..., M, K) and b (K, N) or (..., K, N) with the same batch dims,
    in 3xTF32; every other case is torch.matmul itself."""
    if a.device.type == "meta":
        return torch.matmul(a, b)
    if a.dim() < 2 or b.dim() < 2 or not _cudal1_gemm_runs(a, b) or a.shape[-1] != b.shape[-2]:
        return torch.matmul(a, b)
    if b.dim() == 2:  # (..., M, K) @ (K, N): one matrix product over all leading rows
        out = _cudal1_gemm(a.reshape(1, -1, a.shape[-1]), b.unsqueeze(0))
        return out.reshape(*a.shape[:-1], b.shape[-1])
    if a.dim() == 2:
        a3, b3 = a.unsqueeze(0).expand(b.shape[:-2].numel(), *a.shape), b.reshape(-1, *b.shape[-2:])
    elif a.shape[:-2] == b.shape[:-2]:
        a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    else:
        return torch.matmul(a, b)
    if a3.shape[0] > 65535:
        return torch.matmul(a, b)
    out = _cudal1_gemm(a3, b3)
    batch = b.shape[:-2] if a.dim() == 2 else a.shape[:-2]
    return out.reshape(*batch, a.shape[-2], b.shape[-1])


def _cudal1_linear(x, weight, bias=None):
    """F.linear(x, weight, bias) (x (..., K), weight (N, K)) in 3xTF32; weight is read through its
    transposed strides, never copied."""
    if x.device.type == "meta" or x.dim() < 1:
        return F.linear(x, weight, bias)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if not _cudal1_gemm_runs(*tensors) or x.shape[-1] != weight.shape[1]:
        return F.linear(x, weight, bias)
    out = _cudal1_gemm(x.reshape(1, -1, x.shape[-1]), weight.t().unsqueeze(0),
                       None if bias is None else bias.contiguous())
    return out.reshape(*x.shape[:-1], weight.shape[0])


@triton.jit
def _cudal1_conv2d_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, C, H, W, CO, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, M, K,
                          HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          GROUP_M: tl.constexpr):
    """y = conv2d(x, w) (+ bias per output channel) for contiguous NCHW x and (CO, C, KH, KW) w, one
    group: rows m = (n, oh, ow), columns co, reduction k = (c, kh, kw), each product in 3xTF32."""
    pid = tl.program_id(0)
    tiles_m = (M + BM - 1) // BM
    tiles_n = (CO + BN - 1) // BN
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pm = first_m + (pid % per_group) % rows
    pn = (pid % per_group) // rows
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    n = (rm // (HO * WO)).to(tl.int64)
    oh = (rm // WO) % HO
    ow = rm % WO
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + rk
        c = k // (KH * KW)
        kh = (k // KW) % KH
        kw = k % KW
        ih = oh[:, None] * SH - PH + kh[None, :] * DH
        iw = ow[:, None] * SW - PW + kw[None, :] * DW
        inside = (rm[:, None] < M) & (k[None, :] < K) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a = tl.load(x_ptr + ((n[:, None] * C + c[None, :]) * H + ih) * W + iw, mask=inside, other=0.0)
        b = tl.load(w_ptr + rn[None, :].to(tl.int64) * K + k[:, None], mask=(k[:, None] < K) & (rn[None, :] < CO),
                    other=0.0)
        acc = tl.dot(a, b, acc, input_precision="tf32x3")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < CO, other=0.0)[None, :]
    out = y_ptr + (n[:, None] * CO + rn[None, :]) * (HO * WO) + (oh * WO + ow)[:, None]
    tl.store(out, acc, mask=(rm[:, None] < M) & (rn[None, :] < CO))


def _cudal1_conv_configs():
    shapes = [(128, 128, 32, 3, 8), (128, 64, 32, 3, 4), (64, 128, 32, 3, 4), (64, 64, 32, 4, 4), (128, 32, 32, 3, 4),
              (32, 64, 32, 4, 4)]
    return [triton.Config({"BM": m, "BN": n, "BK": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
            for m, n, k, s, w in shapes]


_cudal1_conv2d_tuned = triton.autotune(configs=_cudal1_conv_configs(), key=["M", "CO", "K"])(_cudal1_conv2d_kernel)


def _cudal1_pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _cudal1_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1):
    """F.conv2d(x, weight, bias, stride, padding, dilation) with one group, for a 4-D input."""
    if x.device.type == "meta" or x.dim() != 4 or weight.dim() != 4 or isinstance(padding, str):
        return F.conv2d(x, weight, bias, stride, padding, dilation)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if not _cudal1_gemm_runs(*tensors) or x.shape[1] != weight.shape[1]:
        return F.conv2d(x, weight, bias, stride, padding, dilation)
    (sh, sw), (ph, pw), (dh, dw) = _cudal1_pair(stride), _cudal1_pair(padding), _cudal1_pair(dilation)
    n, c, h, w = x.shape
    co, _, kh, kw = weight.shape
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if ho <= 0 or wo <= 0:
        return F.conv2d(x, weight, bias, stride, padding, dilation)
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty((n, co, ho, wo), dtype=torch.float32, device=x.device)
    m, k = n * ho * wo, c * kh * kw

    def grid(meta):
        return (triton.cdiv(m, meta["BM"]) * triton.cdiv(co, meta["BN"]),)

    args = (
        x, weight, bias.contiguous() if bias is not None else y, y, c, h, w, co, ho, wo, kh, kw, sh, sw, ph,
        pw, dh, dw, m, k,
    )
    if _cudal1_interpreted():
        _cudal1_conv2d_kernel[grid](*args, HAS_BIAS=bias is not None, BM=32, BN=32, BK=16, GROUP_M=4)
    else:
        _cudal1_conv2d_tuned[grid](*args, HAS_BIAS=bias is not None)
    return y
