"""harness.kernels: profiler kernel names classified as library or custom."""

from __future__ import annotations


def test_kernel_names_classify_library_and_custom():
    from cudal1.harness.kernels import custom_kernels

    library = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, float*)",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1",
        "nvjet_tst_128x64_64x8_1x2_h_bz_TNT", "Memcpy DtoD (Device -> Device)", "triton_poi_fused_add_relu_0",
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm>(Params)", "cudnn::engines_precompiled::nchwToNhwcKernel",
    ]
    custom = ["fused_relu_scale_kernel", "mean_dim0_kernel<float>", "_triton_relu_kernel", "add_kernel"]
    assert custom_kernels(library) == []
    assert custom_kernels(library + custom) == custom
