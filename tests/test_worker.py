"""harness.worker: classification of runtime errors."""

from __future__ import annotations


def test_cuda_error_boilerplate_is_not_an_illegal_memory_access():
    from cudal1.harness.worker import classify_runtime

    boilerplate = ("CUDA kernel errors might be asynchronously reported at some other API call.\n"
                   "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    os_error = RuntimeError("CUDA error: OS call failed or operation not supported on this OS\n" + boilerplate)
    assert "illegal_memory_access" not in classify_runtime(os_error, "correctness").flags
    fault = RuntimeError("CUDA error: an illegal memory access was encountered\n" + boilerplate)
    assert "illegal_memory_access" in classify_runtime(fault, "correctness").flags
    assert "illegal_memory_access" in classify_runtime(RuntimeError("CUDA error: device-side assert triggered"), "x").flags


def test_invalid_address_space_is_an_illegal_memory_access():
    """On the H200 with CUDA 13 an out-of-bounds store surfaced as cudaErrorInvalidAddressSpace."""
    from cudal1.harness.faults import is_cuda_fault
    from cudal1.harness.worker import classify_runtime

    text = "CUDA error: operation not supported on global/shared address space\nSearch for `cudaErrorInvalidAddressSpace'"
    assert "illegal_memory_access" in classify_runtime(RuntimeError(text), "correctness").flags
    assert is_cuda_fault("torch.AcceleratorError: CUDA error: an illegal memory access was encountered")
    assert not is_cuda_fault("CUDA error: out of memory. Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
