"""The clean window: the part of every timed call that the clean reference worker observes on its
own clock, whichever process runs the call.

Contract (docs/harness.md, "Timing"): a timed call's tensor inputs reach the process that runs
it *masked* (XOR with a key stream of a fresh 128-bit key per call), so nothing can be computed on
them before the clean side hands out the key.  That moment is the window's start, on the clean
side's clock.  After the call, the runner copies the outputs into the clean side's output slots,
computes a digest of those slots and publishes (sequence number, digest); the moment the clean
side sees it is the window's end.  The clean side later digests the slots itself: a digest that
matches proves the outputs were final at the window's end, so the window bounds the call's true
time from above, and the runner's own report (its event span) cannot hide more than the window's
known slack.

Pieces (shared by both processes; nothing here judges):

- :class:`Page`: the page both sides read: the clean side writes ``open`` (the sequence number)
  after the key; the runner's GPU writes ``done`` after the digest.  A page is either the
  worker's own pinned page (its reference calls) or a ``memfd`` page shared with the candidate's
  process (:func:`shared_page`, mapped there and registered with CUDA so its gate can poll it).
- :func:`new_key`; :class:`GpuKernels` (mask, digest, publish, flush on the device, from
  :mod:`cudal1.harness.timer_ptx`); :func:`cpu_mask` / :func:`cpu_digest` (the CPU protocol,
  where the key travels in a message instead: a host has no gate).

Limits: the digest proves the outputs' bytes were known at the window's end, not that they were
correct (the clean side re-checks a secret sample of timed calls against the reference); the
window includes the judge's own steps around the call (unmask, L2 flush, snapshot, digest), the
same work on both sides, so the comparison is of the two sides' slack, not of absolute times.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import time
from typing import Any

import numpy as np

PAGE_BYTES = 4096
# byte offsets: open seq and key (4 x u32), written by the clean side; done seq + digest (u64 at +8),
# the gate's status (it opened itself) and started (it is running), written by the runner's GPU
OPEN, KEY, DONE, STATUS, STARTED = 0, 64, 128, 192, 256


def raw_bytes(t: Any) -> Any:
    """A contiguous tensor's bytes as a flat uint8 view (an empty one for no elements)."""
    import torch

    return t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)


def new_key() -> tuple[int, int, int, int]:
    """A fresh per-call key: four 32-bit words."""
    raw = secrets.token_bytes(16)
    return tuple(int.from_bytes(raw[i:i + 4], "little") for i in range(0, 16, 4))  # type: ignore[return-value]


class Page:
    """One window page in this process's memory (``address``: host address of its first byte)."""

    def __init__(self, address: int, keepalive: Any = None) -> None:
        self.address = address
        self._keepalive = keepalive  # the mmap or pinned block behind ``address``
        self._open = ctypes.c_uint32.from_address(address + OPEN)
        self._key = (ctypes.c_uint32 * 4).from_address(address + KEY)
        self._done = ctypes.c_uint32.from_address(address + DONE)
        self._digest = ctypes.c_uint64.from_address(address + DONE + 8)
        self._status = ctypes.c_uint32.from_address(address + STATUS)
        self._started = ctypes.c_uint32.from_address(address + STARTED)
        self.device_address = 0  # where this process's GPU sees it (0: not mapped)

    # ---- the clean side writes ----
    def set_key(self, key: tuple[int, int, int, int]) -> None:
        for i, word in enumerate(key):
            self._key[i] = word

    def open(self, seq: int, key: tuple[int, int, int, int] | None = None) -> None:
        """Write ``key`` (when given), then the sequence number (x86 and Arm keep the order of
        these two plain stores as seen by the device: the gate reads the number with acquire)."""
        if key is not None:
            self.set_key(key)
        self._open.value = seq & 0xFFFFFFFF

    # ---- the runner writes (its GPU, or its host on the CPU) ----
    def publish(self, seq: int, digest: int) -> None:
        self._digest.value = digest & 0xFFFFFFFFFFFFFFFF
        self._done.value = seq & 0xFFFFFFFF

    # ---- reads ----
    @property
    def opened(self) -> int:
        return self._open.value

    @property
    def done(self) -> int:
        return self._done.value

    @property
    def digest(self) -> int:
        return self._digest.value

    @property
    def status(self) -> int:
        return self._status.value

    @property
    def started(self) -> int:
        return self._started.value

    def await_started(self, seq: int, timeout_s: float = 0.1) -> bool:
        """Spin until the gate of call ``seq`` says it is running (False after ``timeout_s``):
        opening a gate that has not started yet would put its launch inside the window."""
        want, deadline = seq & 0xFFFFFFFF, time.perf_counter() + timeout_s
        while self._started.value != want:
            if time.perf_counter() > deadline:
                return False
        return True

    def key(self) -> tuple[int, int, int, int]:
        return tuple(int(self._key[i]) for i in range(4))  # type: ignore[return-value]

    def at(self, offset: int) -> int:
        """Device address of ``offset`` (the page must be mapped for this process's GPU)."""
        return self.device_address + offset


def shared_page() -> int:
    """A new ``memfd`` holding one zeroed page (the caller hands the descriptor to both children)."""
    fd = os.memfd_create("cudal1-window", 0)
    os.ftruncate(fd, PAGE_BYTES)
    return fd


def attach(fd: int) -> Page:
    """Map a :func:`shared_page` descriptor into this process."""
    mem = mmap.mmap(fd, PAGE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    return Page(address, mem)


def map_for_gpu(page: Page) -> Page:
    """Register a shared page with CUDA (pinned, device-mapped) so a gate can poll it."""
    from cudal1.harness import cuda_api

    page.device_address = cuda_api.host_register(page.address, PAGE_BYTES)
    return page


def private_page() -> Page:
    """A pinned, device-mapped page of this process alone (the worker's own reference calls)."""
    from cudal1.harness import cuda_api

    host, dev = cuda_api.host_word(PAGE_BYTES)
    page = Page(host)
    page.device_address = dev
    return page


def cpu_page() -> Page:
    """A page in plain memory (the CPU protocol: no device maps it)."""
    mem = mmap.mmap(-1, PAGE_BYTES)
    return Page(ctypes.addressof(ctypes.c_char.from_buffer(mem)), mem)


# ---- the CPU protocol -------------------------------------------------------------------------------
def cpu_mask(src: np.ndarray, dst: np.ndarray, key: tuple[int, int, int, int], lane: int) -> None:
    """``dst = src XOR stream(key, lane)`` over bytes (uint8 arrays of equal length; numpy's
    Philox4x64-10 keyed with the call's key, the lane in its counter)."""
    n = src.nbytes
    gen = np.random.Philox(key=np.array([key[0] | key[1] << 32, key[2] | key[3] << 32], dtype=np.uint64),
                           counter=np.array([0, 0, lane, 0], dtype=np.uint64))
    stream = gen.random_raw((n + 7) // 8).view(np.uint8)[:n]
    np.bitwise_xor(src, stream, out=dst)


_MULTIPLIERS: dict[int, np.ndarray] = {}


def cpu_digest(data: np.ndarray) -> int:
    """The digest of bytes (uint8 array), as :func:`cudal1_digest` computes it: the sum over the
    8-byte little-endian words ``w_i`` (the last one zero-padded) of ``w_i * (2i + 1)`` mod 2^64."""
    n = data.nbytes
    words = n // 8
    mult = _MULTIPLIERS.get(words)
    if mult is None:
        mult = np.arange(words, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        if len(_MULTIPLIERS) < 64:
            _MULTIPLIERS[words] = mult
    with np.errstate(over="ignore"):
        total = int(np.sum(data[:words * 8].view("<u8") * mult, dtype=np.uint64))
    if n % 8:
        tail = int.from_bytes(bytes(data[words * 8:]), "little")
        total += tail * (2 * words + 1)
    return total & 0xFFFFFFFFFFFFFFFF


# ---- the GPU protocol -------------------------------------------------------------------------------
class GpuKernels:
    """The window's device kernels in this process's context (loaded once, launches prepared)."""

    def __init__(self) -> None:
        from cudal1.harness import cuda_api
        from cudal1.harness.timer_ptx import PTX

        cuda_api.runtime().cudaFree(ctypes.c_void_p(0))  # the primary context exists before the module loads
        self._api = cuda_api
        sms = cuda_api.attribute("sm_count")
        per_sm = max(1, cuda_api.attribute("max_threads_per_sm") // 256)
        self.grid = sms * per_sm
        u64, u32 = ctypes.c_uint64, ctypes.c_uint32
        self._mask = cuda_api.PreparedLaunch(cuda_api.load_function(PTX, "cudal1_mask"), self.grid, 256,
                                             [u64(0), u64(0), u64(0), u64(0), u32(0)])
        self._digest = cuda_api.PreparedLaunch(cuda_api.load_function(PTX, "cudal1_digest"), self.grid, 256,
                                               [u64(0), u64(0), u64(0)])
        self._publish = cuda_api.PreparedLaunch(cuda_api.load_function(PTX, "cudal1_publish"), 1, 1,
                                                [u64(0), u32(0), u64(0)])
        import torch

        self.acc = torch.zeros(2, dtype=torch.int64, device="cuda")  # [0]: the call's digest, [1]: verification

    def mask(self, src: int, dst: int, nbytes: int, key_address: int, lane: int, stream: int) -> None:
        """Queue ``dst = src XOR stream(key at key_address, lane)`` (device addresses, 16-byte aligned)."""
        p = self._mask.params
        p[0].value, p[1].value, p[2].value, p[3].value, p[4].value = src, dst, nbytes, key_address, lane
        self._mask(stream)

    def digest(self, address: int, nbytes: int, stream: int, slot: int = 0) -> None:
        """Queue the digest of ``nbytes`` at ``address`` (8-byte aligned) into accumulator ``slot``."""
        p = self._digest.params
        p[0].value, p[1].value, p[2].value = address, nbytes, self.acc.data_ptr() + 8 * slot
        self._digest(stream)

    def publish(self, done_address: int, seq: int, stream: int) -> None:
        """Queue: write accumulator 0 and then ``seq`` to the page at ``done_address``; zero it."""
        p = self._publish.params
        p[0].value, p[1].value, p[2].value = done_address, seq & 0xFFFFFFFF, self.acc.data_ptr()
        self._publish(stream)

    def take(self, slot: int = 1) -> int:
        """Read and zero accumulator ``slot`` (synchronizes with the current stream)."""
        value = int(self.acc[slot].item()) & 0xFFFFFFFFFFFFFFFF
        self.acc[slot].zero_()
        return value


class Stager:
    """The clean side's half of the window: masks a timed call's inputs into the slots (or into
    its own buffers, for the reference's calls) and digests output slots, on the judged device."""

    def __init__(self, device: Any, kernels: GpuKernels | None = None) -> None:
        import torch

        self.device = device
        self.kernels = kernels
        self.keybuf = torch.zeros(4, dtype=torch.int32, device=device) if device.type == "cuda" else None

    def set_key(self, key: tuple[int, int, int, int]) -> None:
        """The key the next :meth:`mask_into` calls use (on the device: copied there)."""
        import torch

        self.key = key
        if self.keybuf is not None:
            self.keybuf.copy_(torch.from_numpy(np.array(key, dtype=np.uint32).view(np.int32)))

    def mask_into(self, dst: Any, src: Any, lane: int, key: tuple[int, int, int, int]) -> None:
        """``dst`` (a tensor of ``src``'s shape and dtype, on any device) = ``src`` masked with
        ``key`` for ``lane`` (the key must be :meth:`set_key`'s)."""
        import torch

        data = raw_bytes(src.contiguous())
        if self.keybuf is None:  # the CPU protocol
            out = raw_bytes(dst)
            cpu_mask(data.numpy(), out.numpy(), key, lane)
            return
        assert self.kernels is not None
        if data.numel() == 0:
            return
        if data.data_ptr() % 16:
            data = data.clone()
        out = raw_bytes(dst)
        direct = out.is_cuda and out.data_ptr() % 16 == 0
        target = out if direct else torch.empty_like(data)
        self.kernels.mask(data.data_ptr(), target.data_ptr(), data.numel(), self.keybuf.data_ptr(), lane,
                          torch.cuda.current_stream().cuda_stream)
        if not direct:
            out.copy_(target)

    def digest(self, views: list[Any]) -> int:
        """The digest of the bytes of ``views`` (tensors), as the runner computed it."""
        import torch

        if self.keybuf is None:
            return sum(cpu_digest(raw_bytes(v).numpy()) for v in views) & 0xFFFFFFFFFFFFFFFF
        assert self.kernels is not None
        stream = torch.cuda.current_stream().cuda_stream
        for v in views:
            data = raw_bytes(v if v.is_cuda else v.to(self.device))
            if data.numel():
                self.kernels.digest(data.data_ptr(), data.numel(), stream, slot=1)
        return self.kernels.take(1)
