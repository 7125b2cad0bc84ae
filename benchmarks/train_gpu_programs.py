"""The GPU programs ``benchmarks/train_gpu.py`` adds to the smoke task's variants (never part of the
CPU smokes, so not shipped in the package): a custom CUDA kernel built with ``load_inline`` at
import and a ``@triton.jit`` kernel, both correct and fast on the bundled ``diag_scale`` task, and
:func:`program_kind`, the textual classification its report uses.
"""

from __future__ import annotations

# A custom CUDA kernel built with ``load_inline`` at import (so the judge's CPU pre-build compiles
# it) and a ``@triton.jit`` kernel.  Both scale row i of B by A[i] in one pass
# over B (float4 loads/stores in the CUDA kernel when B's rows allow it), launched on the current
# stream; fast, like ``broadcast``.  float32 on CUDA only (the task's inputs).  Written without blank
# lines and with every line unique to its program (after the first import): the smoke tokenizer makes
# each line one token, so the tiny policy reproduces a program when each line has one successor;
# shared or repeated lines would let it splice programs together (new sources, each a fresh build).
CUDA_ROW_SCALE = '''import torch
from torch.utils.cpp_extension import load_inline
CUDA_SRC = r"""
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <cstdint>
__global__ void row_scale_vec4(const float* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ out, int64_t cols4, int64_t n4) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float s = a[i / cols4]; const float4 v = b[i]; out[i] = make_float4(v.x * s, v.y * s, v.z * s, v.w * s); } }
__global__ void row_scale_scalar(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, int64_t cols, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) out[i] = b[i] * a[i / cols]; }
torch::Tensor row_scale(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && a.dim() == 1 && b.dim() == 2 && a.size(0) == b.size(0), "row_scale: a (N,) and b (N, M) on CUDA");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32, "row_scale: float32 expected");
    auto ac = a.contiguous(); auto bc = b.contiguous(); auto out = torch::empty_like(bc);
    const int64_t n = bc.numel(), cols = bc.size(1);
    if (n == 0) return out;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const bool vec4 = cols % 4 == 0 && ((reinterpret_cast<uintptr_t>(bc.data_ptr<float>()) | reinterpret_cast<uintptr_t>(out.data_ptr<float>())) % 16 == 0);
    const unsigned blocks = (unsigned)std::min<int64_t>(((vec4 ? n / 4 : n) + 255) / 256, 65536);
    if (vec4) row_scale_vec4<<<blocks, 256, 0, stream>>>(ac.data_ptr<float>(), reinterpret_cast<const float4*>(bc.data_ptr<float>()), reinterpret_cast<float4*>(out.data_ptr<float>()), cols / 4, n / 4);
    else row_scale_scalar<<<blocks, 256, 0, stream>>>(ac.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), cols, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out; }
"""
_ext = load_inline(name="cudal1_smoke_row_scale", cpp_sources="torch::Tensor row_scale(torch::Tensor a, torch::Tensor b);", cuda_sources=CUDA_SRC, functions=["row_scale"], extra_cuda_cflags=["-O3"], verbose=False)
class ModelNew(torch.nn.Module):  # the custom CUDA kernel
    def forward(self, A, B):  # one CUDA launch per call
        return _ext.row_scale(A, B)
'''

TRITON_ROW_SCALE = '''import torch
import triton
import triton.language as tl
@triton.jit
def _row_scale_kernel(a_ptr, b_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < cols
    s = tl.load(a_ptr + row)
    x = tl.load(b_ptr + row * cols + col, mask=mask)
    tl.store(out_ptr + row * cols + col, x * s, mask=mask)
class ModelNew(torch.nn.Module):  # one Triton launch per call
    def forward(self, A, B):  # row i of B times A[i]
        A, B = A.contiguous(), B.contiguous()
        out = torch.empty_like(B)
        _row_scale_kernel[(B.shape[0], triton.cdiv(B.shape[1], 1024))](A, B, out, B.shape[1], BLOCK=1024)
        return out  # written by the Triton kernel
'''

GPU_VARIANTS: dict[str, str] = {"cuda_row_scale": CUDA_ROW_SCALE, "triton_row_scale": TRITON_ROW_SCALE}


def program_kind(code: str | None) -> str:
    """``cuda`` (a ``load_inline`` extension called in the program), ``triton`` (a ``@triton.jit``
    kernel launched), ``pytorch`` (anything else), ``none`` (no code).  A textual heuristic for
    reports: the judge's ``no_custom_kernel`` flag says what actually ran."""
    if not code:
        return "none"
    if "load_inline" in code and "_ext." in code:
        return "cuda"
    if "@triton.jit" in code and "](" in code:
        return "triton"
    return "pytorch"


__all__ = ["CUDA_ROW_SCALE", "GPU_VARIANTS", "TRITON_ROW_SCALE", "program_kind"]
