"""One timer for every timed call, reference and candidate alike, in whichever process runs it;
it measures, it does not judge.

CUDA protocol for one call (docs/harness.md, "Timing"):
  reset persisting L2 lines → **gate** (one kernel that fills every multiprocessor and waits until
  a host page says "open") → unmask the call's inputs (:mod:`cudal1.harness.window`) → overwrite
  twice the L2 with zeros → ``start`` event → call → ``end`` event → snapshot of the outputs into
  their slots (on the calling stream) → digest of the slots and "done" written to the page →
  *issued* (the clean side opens the gate) → device-wide synchronize → ``end_device`` event.
  Slots that are not this process's own memory (the candidate's: the reference worker's blocks
  opened by IPC handle, or host files) get the snapshot in this process's memory instead, digested
  there, and are filled from it after ``end_device``: writing and reading IPC-opened memory ran
  37-55% slower than local memory on an H200 (``benchmarks/slot_copy.py``), which the
  candidate's window would hold and the reference's, whose targets are its own, would not.
While the gate holds the GPU, the host issues the whole call, so the ``start → end`` span is the
call's GPU time without host wake-up or launch latency.  Because the gate occupies every thread
slot of every multiprocessor, work the call puts on *other* streams cannot start early either.
Work left running on other streams is not in the span; it is caught by the snapshot (an output
still being written when the calling stream ended differs from itself after the synchronize:
``escaped``) and by ``device_ms`` (start → after the device-wide synchronize, including the host's
wake-up).  ``host_ms`` is the host's time to issue the call.  A call that blocks inside (a
synchronize, a ``cudaMalloc`` that waits for the device) cannot finish while the gate is closed:
the gate is opened anyway after ``watchdog_s`` (by the clean side, or by itself on the clean
side's own calls) and the sample says so (``blocked``).

A timed call under a :class:`CallWindow` is also observed by the clean reference worker on its own
clock (:mod:`cudal1.harness.window`): the inputs arrive masked, the gate opens only when that
worker hands out the key, and the worker sees the outputs' digest appear.  Without a window (the
calibration and the join probe) the timer opens its own gate.

Raw spans include the cost of the two events and of one kernel launch (``overhead_ms``, the span
of a gated call that launches one empty kernel); the statistics subtract the clean side's figure,
so a single-kernel call reads as its kernel's duration.

CPU protocol: ``time.perf_counter_ns`` around the call; torch CPU ops are synchronous, so every
figure is the same number.  Under a window the key arrives in a message (a host has no gate).
"""

from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from cudal1.harness.compare import same_bits as _same_bits
from cudal1.harness.wire import output_leaves as _output_leaves
from cudal1.harness.wire import storage_order


def _as_snapshot(leaf: Any, snap: torch.Tensor) -> Any:
    """``leaf`` in the layout its snapshot was taken in (for comparing the two bit by bit)."""
    if not isinstance(leaf, torch.Tensor) or snap.shape == leaf.shape and leaf.is_contiguous():
        return leaf
    flat = storage_order(leaf.detach())
    return flat.reshape(snap.shape) if flat is not None and flat.numel() == snap.numel() else leaf

# Captured before candidate code runs: a candidate rebinding these cannot change the clock.
_perf_counter_ns = time.perf_counter_ns
_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event
_current_stream = torch.cuda.current_stream
_SELF_OPEN_TIMEOUT_S = 30.0  # a gate that waits for the clean side opens itself after this (it never should)


@dataclass
class CallTiming:
    """One timed call.  ``gpu_ms``: start → end on the calling stream; ``device_ms``: start →
    after a device-wide synchronize; ``host_ms``: the host's time to issue the call; ``blocked``:
    the call waited inside and the gate opened without it; ``escaped``: an output changed after
    the calling stream had finished (work on another stream was still writing it)."""

    gpu_ms: float
    device_ms: float
    host_ms: float
    blocked: bool = False
    escaped: bool = False


def gate_wait_s(host_ms: list[float], factor: float = 4.0) -> float:
    """How long a gate waits for its call to be issued: ``factor`` times the longest issue time
    seen in warm-up (5 ms to 1 s)."""
    return min(1.0, max(0.005, factor * 1e-3 * max(host_ms, default=0.0)))


class GateWait:
    """One side's gate wait over its timed calls (the reference's in its worker, the candidate's as
    the worker waits for its ``issued``).

    A call is normally issued well within four times its longest warm-up issue time
    (:func:`gate_wait_s`).  A call that waits for the device inside (a synchronize, a blocking
    copy, an ``.item()``) is never issued while the gate holds the GPU: each such call costs the
    whole wait, and none of the wait is timed (the events run once the gate opens).  After two
    blocked calls in a row the wait drops to the longest warm-up issue time itself, which the part
    of a call issued before it blocks does not exceed (a warm-up call's time held that part, its
    wait for the device and the rest); the next call that is issued in time restores it.  The
    figures do not depend on it: it only spends less wall time on calls that block every time.
    ``shortens=False`` (the CPU protocol, which has no gate) keeps the full wait throughout."""

    def __init__(self, host_ms: list[float], shortens: bool = True) -> None:
        self.full_s = gate_wait_s(host_ms)
        self.short_s = gate_wait_s(host_ms, 1.0) if shortens else self.full_s
        self.blocked_in_a_row = 0
        self.shortened = 0  # calls that waited the short time

    def wait_s(self) -> float:
        if self.blocked_in_a_row >= 2 and self.short_s < self.full_s:
            self.shortened += 1
            return self.short_s
        return self.full_s

    def saw(self, blocked: bool) -> None:
        """The last call's gate opened without it (``blocked``) or after it was issued."""
        self.blocked_in_a_row = self.blocked_in_a_row + 1 if blocked else 0


@dataclass
class CallWindow:
    """What a windowed call runs under (see the module doc and :mod:`cudal1.harness.window`).

    ``page``: the page the gate polls and the digest goes to; ``seq``: the call's number on it;
    ``unmask``: uint8 buffers holding the call's masked inputs, unmasked in place in this order
    (lane = position) with the key the page holds once open; ``targets``: per output tensor
    leaf, in order, the slot view its snapshot goes into (None, or a leaf that does not fit: a
    private clone, not digested); ``issued(host_ms)``: called once the whole call is enqueued (the
    clean side opens the gate now); ``key()``, CPU only: blocks until the key is handed out;
    ``published(digest)``, CPU only: the outputs are in their slots (the digest is 0 there: the
    clean side snapshots the shared slots itself).  ``gate_timeout_s``: when
    the gate opens by itself.  ``own_targets``: the targets are this process's own device memory
    (the reference's calls); otherwise each snapshot is staged here and copied into its target
    after the call's clocks stopped."""

    page: Any
    seq: int
    unmask: list[torch.Tensor] = field(default_factory=list)
    targets: list[torch.Tensor | None] = field(default_factory=list)
    issued: Callable[[float], None] = lambda host_ms: None
    key: Callable[[], tuple[int, int, int, int]] | None = None
    published: Callable[[int], None] = lambda digest: None
    gate_timeout_s: float = _SELF_OPEN_TIMEOUT_S
    own_targets: bool = False


def _fits(target: torch.Tensor | None, leaf: torch.Tensor, device_type: str) -> bool:
    """Whether an output leaf goes into its slot: the rule of :func:`cudal1.harness.wire.encode_outputs`."""
    return (target is not None and type(leaf) is torch.Tensor and not leaf.is_meta and leaf.device.type == device_type
            and leaf.layout is torch.strided and leaf.dtype == target.dtype and leaf.shape == target.shape)


def _snapshot(target: torch.Tensor, leaf: torch.Tensor) -> None:
    """Copy ``leaf`` into its (contiguous) slot view: a dense leaf's storage bytes as they lie
    (:func:`cudal1.harness.wire.storage_order`: a channels-last output costs a plain copy, as a
    contiguous one does, so both sides' windows hold the same work), any other one element by
    element."""
    flat = storage_order(leaf.detach())
    if flat is None:
        target.copy_(leaf.detach())
    else:
        target.reshape(-1).copy_(flat)


class CudaTimer:
    """The gated timer in this process's CUDA context.  ``page``: the timer's own page (calls
    without a window open their own gate through it)."""

    clock = "cuda_event"

    def __init__(self, device: torch.device, flush_l2: bool = True) -> None:
        from cudal1.harness import cuda_api, window
        from cudal1.harness.timer_ptx import PTX

        self.device = device
        self._api = cuda_api
        self.kernels = window.GpuKernels()
        self.page = window.private_page()
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20
        self._flush_buf = torch.empty(max(16, 2 * l2 if flush_l2 else 16) // 16 * 4, dtype=torch.int32, device=device)
        self.keybuf = torch.zeros(
            8, dtype=torch.int32, device=device
        )  # the open call's key, and the gate's release word
        per_sm = max(1, cuda_api.attribute("max_threads_per_sm") // 1024)
        u64, u32 = ctypes.c_uint64, ctypes.c_uint32
        self._gate = cuda_api.PreparedLaunch(cuda_api.load_function(PTX, "cudal1_gate"),
                                             cuda_api.attribute("sm_count") * per_sm, 1024,
                                             [u64(0), u32(0), u64(0), u64(self.keybuf.data_ptr()), u64(0), u64(0),
                                              u64(0), u32(0)])
        self._flush = cuda_api.PreparedLaunch(cuda_api.load_function(PTX, "cudal1_flush"), self.kernels.grid, 256,
                                              [u64(self._flush_buf.data_ptr()), u64(self._flush_buf.numel() // 4)])
        self._spin = cuda_api.PreparedLaunch(cuda_api.load_function(PTX, "cudal1_spin"), 1, 1, [u64(0)])
        self._seq = 0
        self._launches = 0
        self.watchdog_s = 0.05  # how long a gate waits for the host before it is opened anyway
        self._events = [_Event(enable_timing=True) for _ in range(3)]
        self.calibration: list[float] = []  # device_ms - gpu_ms on honest busy calls (the join cost)
        self.overhead_ms = 0.0  # gpu_ms of an empty gated call (the events' own cost)
        self._reset_l2: Callable[[], None] = cuda_api.reset_persisting_l2

    def calibrate(self, n: int = 30) -> None:
        """The span of a call that launches one empty kernel (the events' cost and one launch's
        gap: what a single-kernel call adds to its kernel's own duration), and the device-wide
        join cost on busy calls (:meth:`join_probe`)."""
        self.overhead_ms = statistics.median(self.time_call(self.spin, (0,))[0].gpu_ms for _ in range(n))
        self.calibration.extend(self.join_probe(n))

    def join_probe(self, n: int = 10) -> list[float]:
        """This process's device-wide join cost: ``device_ms − gpu_ms`` of ``n`` calls of a 50 µs
        spin (what the host's wake-up from the synchronize adds once a call's work has ended)."""
        costs = []
        for _ in range(n):
            t, _ = self.time_call(self.spin, (50_000,))
            costs.append(t.device_ms - t.gpu_ms)
        return costs

    def spin(self, ns: int) -> None:
        """Queue the timer's own spin kernel (``ns`` nanoseconds of the GPU's clock)."""
        self._spin.params[0].value = ns
        self._spin(_current_stream().cuda_stream)

    def set_watchdog(self, host_ms: list[float]) -> None:
        """Size the gate's wait for the host from the host's issue times seen so far (warm-up)."""
        self.watchdog_s = gate_wait_s(host_ms)

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def time_call(self, fn: Callable[..., Any], args: tuple, check_escape: bool = True,
                  window: CallWindow | None = None) -> tuple[CallTiming, Any]:
        """One gated call.  Without ``window`` the timer opens its own gate once the call is
        issued (it waits ``watchdog_s`` at most for a call that blocks inside).
        ``check_escape=False`` (the clean side's own calls) still takes the snapshot, so both
        sides' device-wide spans hold the same work, but does not compare it afterwards."""
        if window is None:
            seq = self.next_seq()
            window = CallWindow(self.page, seq, issued=lambda _ms: self.page.open(seq), gate_timeout_s=self.watchdog_s)
        page = window.page
        start, end, end_device = self._events
        stream = _current_stream().cuda_stream
        # Where the snapshots of slots that are not this process's own go: allocated now, before the
        # gate holds the device (an allocation under it could wait for the device).
        staging = [None if t is None or (window.own_targets and t.is_cuda)
                   else torch.empty(tuple(t.shape), dtype=t.dtype, device=self.device) for t in window.targets]
        try:
            self._reset_l2()
        except Exception:  # noqa: BLE001 - drivers without persisting L2 support
            pass
        g = self._gate.params
        g[0].value, g[1].value, g[2].value = page.at(0), window.seq & 0xFFFFFFFF, page.at(64)
        g[4].value, g[5].value, g[6].value = int(window.gate_timeout_s * 1e9), page.at(192), page.at(256)
        self._launches += 1
        g[7].value = self._launches & 0xFFFFFFFF  # never 0: the release word starts at 0
        self._gate(stream)
        for lane, buf in enumerate(window.unmask):
            self.kernels.mask(buf.data_ptr(), buf.data_ptr(), buf.numel(), self.keybuf.data_ptr(), lane, stream)
        self._flush(stream)
        start.record()
        t0 = _perf_counter_ns()
        try:
            out = fn(*args)
        except BaseException:
            page.open(window.seq)  # never leave the GPU held (the key may be stale: the call failed anyway)
            raise
        host_ms = (_perf_counter_ns() - t0) / 1e6
        end.record()
        stream = _current_stream().cuda_stream  # the snapshot and its digest follow the call's end on its stream
        leaves = _output_leaves(out)
        snapshot: list[torch.Tensor | None] = []
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []  # (slot, snapshot): filled after the clocks stop
        for i, leaf in enumerate(leaves):
            target = window.targets[i] if i < len(window.targets) else None
            if not _fits(target, leaf, "cuda"):
                snapshot.append(leaf.clone() if isinstance(leaf, torch.Tensor) and leaf.is_cuda else None)
                continue
            assert target is not None
            stage = staging[i]
            if stage is None:
                _snapshot(target, leaf)
                snap = target
            else:  # another process's memory (or the host's: a copy now would wait for the gate)
                _snapshot(stage, leaf)
                snap = stage
                staged.append((target, snap))
            if snap.numel():
                self.kernels.digest(snap.data_ptr(), snap.numel() * snap.element_size(), stream)
            snapshot.append(snap)
        if window.targets:
            self.kernels.publish(page.at(128), window.seq, stream)
        window.issued(host_ms)
        _synchronize(self.device)
        end_device.record()
        end_device.synchronize()
        blocked = page.status == (window.seq & 0xFFFFFFFF)
        for target, snap in staged:
            target.copy_(snap)
        if staged:
            _synchronize(self.device)  # the clean side reads the slots once this process replies
        escaped = check_escape and any(s is not None and not _same_bits(s, _as_snapshot(leaf, s))
                                       for s, leaf in zip(snapshot, leaves))
        return CallTiming(start.elapsed_time(end), start.elapsed_time(end_device), host_ms, blocked, escaped), out


class CpuTimer:
    clock = "cpu_monotonic"

    def __init__(self, device: torch.device, flush_l2: bool = True) -> None:
        self.device = device
        self.calibration: list[float] = []
        self.overhead_ms = 0.0
        self.watchdog_s = 0.05
        self._seq = 0

    def calibrate(self, n: int = 30) -> None:
        return None

    def join_probe(self, n: int = 10) -> list[float]:
        return []

    def set_watchdog(self, host_ms: list[float]) -> None:
        return None

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def time_call(self, fn: Callable[..., Any], args: tuple, check_escape: bool = True,
                  window: CallWindow | None = None) -> tuple[CallTiming, Any]:
        """One call; under ``window``: tell the clean side it may start, wait for the key, unmask,
        time the call, copy the outputs into their slots and say so (no digest: host slots are
        shared memory, and the clean side copies them the moment it hears ``done``)."""
        from cudal1.harness.window import cpu_mask, raw_bytes

        if window is not None:
            window.issued(0.0)
            key = window.key() if window.key is not None else window.page.key()
            for lane, buf in enumerate(window.unmask):
                cpu_mask(buf.numpy(), buf.numpy(), key, lane)
        t0 = _perf_counter_ns()
        out = fn(*args)
        ms = (_perf_counter_ns() - t0) / 1e6
        if window is not None:
            for i, leaf in enumerate(_output_leaves(out)):
                target = window.targets[i] if i < len(window.targets) else None
                if not _fits(target, leaf, "cpu"):
                    continue
                flat = storage_order(leaf.detach())
                if flat is not None:  # one thread: torch's copy waits for its whole pool, late under load
                    raw_bytes(target).numpy()[:] = raw_bytes(flat).numpy()  # type: ignore[arg-type]
                else:
                    target.copy_(leaf.detach())  # type: ignore[union-attr]
            window.published(0)  # host slots: the clean side reads them itself the moment it hears this
        return CallTiming(ms, ms, ms), out


def make_timer(device: torch.device, flush_l2: bool = True) -> CudaTimer | CpuTimer:
    return CudaTimer(device, flush_l2) if device.type == "cuda" else CpuTimer(device, flush_l2)
