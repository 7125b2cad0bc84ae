"""The few CUDA runtime/driver calls the judge makes itself, through ctypes on the libraries
torch already loaded (no new dependency, no compiler).

Contract: every function needs an initialised CUDA context on the calling thread (call it after
``torch.cuda.init()`` or any CUDA tensor); a failing call raises :class:`CudaCallError` naming
the call and its error code.  What lives here: raw device allocations and their IPC handles
(the shared slots between the reference worker and the candidate's process), mapped pinned host
words (the timer's gate), PTX modules for the timer's kernels (launched with a parameter block
built once), device attributes (peak memory bandwidth for the physics floor) and the
persisting-L2 controls.  Handles cross processes as hex text: a 64-byte ``cudaIpcMemHandle_t``
is passed to ``cudaIpcOpenMemHandle`` *by value*.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


class CudaCallError(RuntimeError):
    """A CUDA runtime or driver call returned an error."""


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _loaded(fragment: str) -> str | None:
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.count(" ") >= 5 else ""
                if fragment in path:
                    return path
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=None)
def runtime() -> Any:
    """libcudart as torch loaded it (the same runtime, so the same primary context)."""
    import torch

    torch.cuda.init()
    path = _loaded("libcudart")
    major = (torch.version.cuda or "12").split(".")[0]
    return ctypes.CDLL(path or f"libcudart.so.{major}")


@functools.lru_cache(maxsize=None)
def driver() -> Any:
    return ctypes.CDLL(_loaded("libcuda.so") or "libcuda.so.1")


# cudaErrorMemoryAllocation: named so that the judge's out-of-memory rule (harness.faults) sees it,
# and a slot that could not be allocated beside other workers is judged again alone
_NAMED = {2: "out of memory"}


def _check(rc: int, what: str) -> None:
    if rc:
        name = f" ({_NAMED[rc]})" if rc in _NAMED else ""
        raise CudaCallError(f"{what} failed with CUDA error {rc}{name}")


# ---- raw device memory and IPC ----------------------------------------------------------------
def malloc(nbytes: int) -> int:
    ptr = ctypes.c_void_p()
    _check(runtime().cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(1, nbytes))), "cudaMalloc")
    return int(ptr.value or 0)


def free(ptr: int) -> None:
    runtime().cudaFree(ctypes.c_void_p(ptr))


def ipc_handle(ptr: int) -> str:
    """The IPC handle of a :func:`malloc`'d block (offset 0), as hex text."""
    handle = _IpcHandle()
    _check(runtime().cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(ptr)), "cudaIpcGetMemHandle")
    return bytes(ctypes.string_at(ctypes.addressof(handle), 64)).hex()


def ipc_open(handle_hex: str) -> int:
    raw = bytes.fromhex(handle_hex)
    if len(raw) != 64:
        raise CudaCallError("an IPC handle is 64 bytes")
    handle = _IpcHandle.from_buffer_copy(raw)
    ptr = ctypes.c_void_p()
    fn = runtime().cudaIpcOpenMemHandle
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcHandle, ctypes.c_uint]
    _check(fn(ctypes.byref(ptr), handle, 1), "cudaIpcOpenMemHandle")  # 1: lazy peer access
    return int(ptr.value or 0)


def ipc_close(ptr: int) -> None:
    runtime().cudaIpcCloseMemHandle(ctypes.c_void_p(ptr))


class _ArrayInterface:
    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def byte_tensor(ptr: int, nbytes: int) -> Any:
    """A ``uint8`` CUDA tensor aliasing ``nbytes`` at device address ``ptr`` (no copy; the caller
    keeps the memory alive)."""
    import torch

    return torch.as_tensor(_ArrayInterface(ptr, nbytes), device="cuda")


# ---- mapped host words (the gate) -------------------------------------------------------------
def host_word(nbytes: int = 64) -> tuple[int, int]:
    """A pinned, device-mapped, zeroed host block of ``nbytes``: (host address, device address)."""
    host = ctypes.c_void_p()
    _check(runtime().cudaHostAlloc(ctypes.byref(host), ctypes.c_size_t(nbytes), 2), "cudaHostAlloc")  # 2: mapped
    dev = ctypes.c_void_p()
    _check(runtime().cudaHostGetDevicePointer(ctypes.byref(dev), host, 0), "cudaHostGetDevicePointer")
    ctypes.memset(host, 0, nbytes)
    return int(host.value or 0), int(dev.value or 0)


def host_register(ptr: int, nbytes: int) -> int:
    """Pin ``nbytes`` of this process's memory at ``ptr`` (page-aligned; e.g. a shared ``memfd``
    mapping) and map it into the device's address space: returns its device address."""
    _check(runtime().cudaHostRegister(ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes), 3),
           "cudaHostRegister")  # 3: portable | mapped
    dev = ctypes.c_void_p()
    _check(runtime().cudaHostGetDevicePointer(ctypes.byref(dev), ctypes.c_void_p(ptr), 0), "cudaHostGetDevicePointer")
    return int(dev.value or 0)


def host_unregister(ptr: int) -> None:
    runtime().cudaHostUnregister(ctypes.c_void_p(ptr))


# ---- modules and launches ---------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _module(ptx: str) -> int:
    """A module JIT-compiled by the driver from PTX text, once per text."""
    module = ctypes.c_void_p()
    _check(driver().cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(ptx.encode())), "cuModuleLoadData")
    return int(module.value or 0)


def load_function(ptx: str, name: str) -> int:
    """A kernel from PTX text (the module is compiled for this GPU on first use, then reused)."""
    fn = ctypes.c_void_p()
    _check(driver().cuModuleGetFunction(ctypes.byref(fn), ctypes.c_void_p(_module(ptx)), name.encode()),
           "cuModuleGetFunction")
    return int(fn.value or 0)


@functools.lru_cache(maxsize=None)
def _launch_kernel() -> Any:
    fn = driver().cuLaunchKernel
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    return fn


class PreparedLaunch:
    """A kernel launch whose parameter block is built once: set ``params[i].value`` between
    launches, then call with the stream.  ``params`` are ctypes scalars in the kernel's order."""

    def __init__(self, fn: int, grid: int, block: int, params: list[Any]) -> None:
        self.params = params
        self._array = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p)
                                                        for p in params])
        self._fn, self._grid, self._block = ctypes.c_void_p(fn), grid, block
        self._launch = _launch_kernel()

    def __call__(self, stream: int) -> None:
        _check(self._launch(self._fn, self._grid, 1, 1, self._block, 1, 1, 0, stream, self._array, None),
               "cuLaunchKernel")


# ---- device facts -----------------------------------------------------------------------------
_ATTR = {"memory_clock_khz": 36, "bus_width_bits": 37, "l2_bytes": 38, "sm_count": 16,
         "max_threads_per_sm": 39, "persisting_l2_max": 108}


def attribute(name: str, device: int = 0) -> int:
    value = ctypes.c_int()
    _check(
        runtime().cudaDeviceGetAttribute(ctypes.byref(value), _ATTR[name], device), f"cudaDeviceGetAttribute({name})"
    )
    return value.value


def peak_bandwidth(device: int = 0) -> float | None:
    """Peak device-memory bandwidth in bytes/s from the memory clock and bus width (DDR: two
    transfers per clock); None when the device does not say."""
    try:
        clock_khz, bits = attribute("memory_clock_khz", device), attribute("bus_width_bits", device)
    except CudaCallError:
        return None
    if clock_khz <= 0 or bits <= 0:
        return None
    return 2.0 * clock_khz * 1e3 * bits / 8.0


# ---- persisting L2 ----------------------------------------------------------------------------
_LIMIT_PERSISTING_L2 = 0x06


def persisting_l2_limit() -> int:
    value = ctypes.c_size_t()
    _check(runtime().cudaDeviceGetLimit(ctypes.byref(value), _LIMIT_PERSISTING_L2), "cudaDeviceGetLimit")
    return int(value.value)


def persisting_l2(on_cuda: bool) -> int:
    """The device's persisting-L2 limit as this process sees it: 0 off CUDA or where the call fails."""
    if not on_cuda:
        return 0
    try:
        return persisting_l2_limit()
    except CudaCallError:
        return 0


def reset_persisting_l2() -> None:
    """Demote every persisting L2 line to normal (``cudaCtxResetPersistingL2Cache``)."""
    _check(runtime().cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache")


def stream_access_window_bytes(stream: int) -> int:
    """``num_bytes`` of the stream's access-policy window (0: none set)."""
    import struct

    value = (ctypes.c_ubyte * 64)()
    _check(runtime().cudaStreamGetAttribute(ctypes.c_void_p(stream), 1, value), "cudaStreamGetAttribute")
    _base, nbytes = struct.unpack_from("QQ", value, 0)
    return int(nbytes)
