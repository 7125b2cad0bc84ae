"""Sticky CUDA faults: after one of these the worker's CUDA context is unusable, and the verdict
carries the ``illegal_memory_access`` flag.  One list for the worker (exception text) and the
parent (log tail of a worker that died).  Also what counts as running out of memory (``oom``).

The same fault surfaces under different names across drivers and CUDA versions: an
out-of-bounds access on an H200 with CUDA 13 can arrive as ``cudaErrorInvalidAddressSpace``
("operation not supported on global/shared address space") instead of
``cudaErrorIllegalAddress``.  Only "device-side assert triggered" counts, never "device-side
assert": torch appends "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions" to
*every* CUDA error message.
"""

from __future__ import annotations

import traceback

CUDA_FAULT_SIGNS = (
    "illegal memory access",
    "cudaErrorIllegalAddress",
    "illegal instruction",
    "cudaErrorIllegalInstruction",
    "misaligned address",
    "cudaErrorMisalignedAddress",
    "invalid address space",
    "global/shared address space",
    "cudaErrorInvalidAddressSpace",
    "invalid program counter",
    "unspecified launch failure",
    "cudaErrorLaunchFailure",
    "device-side assert triggered",
)


def is_cuda_fault(text: str) -> bool:
    """Whether ``text`` (an exception message or a log tail) reports a sticky CUDA fault."""
    return any(sign in text for sign in CUDA_FAULT_SIGNS)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` reports that an allocation failed (PyTorch's ``OutOfMemoryError``, or a CUDA
    or extension error that says "out of memory")."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)


def runtime_error_parts(exc: BaseException, where: str) -> tuple[str, list[str], str]:
    """A ``runtime_error`` verdict's message, flags (``oom``, ``illegal_memory_access``) and
    traceback tail for ``exc`` raised ``where``: the same in both of a job's processes."""
    text = f"{type(exc).__name__}: {exc}"
    flags = ["oom"] if is_out_of_memory(exc) else []
    if is_cuda_fault(text):
        flags.append("illegal_memory_access")
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
    return f"{where}: {text[:2000]}", flags, tb[-4000:]
