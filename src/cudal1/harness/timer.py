"""One timer for every timed call, reference and candidate alike, in whichever process runs it;
it measures, it does not judge.

CUDA protocol for one call (docs/harness.md, "Timing"):
  reset persisting L2 lines → **gate** (one kernel that fills every multiprocessor and waits on a
  host-mapped word, then overwrites twice the L2 with zeros) → ``start`` event → call →
  ``end`` event → snapshot of the outputs (on the calling stream) → the host opens the gate →
  device-wide synchronize → ``end_device`` event.
While the gate holds the GPU, the host issues the whole call, so the ``start → end`` span is the
call's GPU time without host wake-up or launch latency (the ~40 µs that a synchronize followed by
a launch puts under every call).  Because the gate occupies every thread slot of every
multiprocessor, work the call puts on *other* streams cannot start early either: it starts with
the call and is charged when the calling stream waits for it.  Work left running on other streams
is not in the span; it is caught by the snapshot (an output still being written when the calling
stream ended differs from itself after the synchronize: ``escaped``) and by ``device_ms`` (start →
after the device-wide synchronize, including the host's wake-up: the judge compares its excess
with the clean side's calibration).  ``host_ms`` is the host's time to issue the call.  A call that
blocks inside (a synchronize, a ``cudaMalloc`` that waits for the device) cannot finish while the
gate is closed: the gate opens itself after ``watchdog_s`` and the sample says so (``blocked``); the
span then includes the host's gaps after that point, as it does in real use.

Raw spans include the cost of the two events and of one kernel launch (``overhead_ms``, the span
of a gated call that launches one empty kernel); the statistics subtract the clean side's figure,
so a single-kernel call reads as its kernel's duration.

CPU protocol: ``time.perf_counter_ns`` around the call; torch CPU ops are synchronous, so every
figure is the same number.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from cudal1.harness.compare import same_bits as _same_bits

# Captured before candidate code runs: a candidate rebinding these cannot change the clock.
_perf_counter_ns = time.perf_counter_ns
_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event
_current_stream = torch.cuda.current_stream

_GATE_PTX = r"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry cudal1_gate(.param .u64 p_flag, .param .u32 p_target, .param .u64 p_buf, .param .u64 p_n,
                            .param .u64 p_timeout_ns, .param .u64 p_status)
{
    .reg .pred %p<5>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<16>;
    ld.param.u64 %rd1, [p_flag];
    ld.param.u32 %r1, [p_target];
    ld.param.u64 %rd2, [p_buf];
    ld.param.u64 %rd3, [p_n];
    ld.param.u64 %rd10, [p_timeout_ns];
    ld.param.u64 %rd11, [p_status];
    mov.u32 %r2, %tid.x;
    setp.ne.u32 %p1, %r2, 0;
    @%p1 bra WAITED;
    mov.u64 %rd12, %globaltimer;
POLL:
    ld.relaxed.sys.u32 %r3, [%rd1];
    setp.ge.u32 %p2, %r3, %r1;
    @%p2 bra WAITED;
    mov.u64 %rd13, %globaltimer;
    sub.u64 %rd14, %rd13, %rd12;
    setp.lt.u64 %p4, %rd14, %rd10;
    @%p4 bra POLL;
    st.relaxed.sys.u32 [%rd11], %r1;
WAITED:
    bar.sync 0;
    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ntid.x;
    mov.u32 %r6, %nctaid.x;
    mul.wide.u32 %rd4, %r4, %r5;
    cvt.u64.u32 %rd5, %r2;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r6, %r5;
    cvta.to.global.u64 %rd7, %rd2;
    mov.u32 %r7, 0;
LOOP:
    setp.ge.u64 %p3, %rd4, %rd3;
    @%p3 bra DONE;
    shl.b64 %rd8, %rd4, 4;
    add.u64 %rd9, %rd7, %rd8;
    st.global.v4.u32 [%rd9], {%r7, %r7, %r7, %r7};
    add.u64 %rd4, %rd4, %rd6;
    bra.uni LOOP;
DONE:
    ret;
}

.visible .entry cudal1_spin(.param .u64 p_ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [p_ns];
    mov.u64 %rd2, %globaltimer;
SPIN:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra SPIN;
    ret;
}
"""


@dataclass
class CallTiming:
    """One timed call.  ``gpu_ms``: start → end on the calling stream; ``device_ms``: start →
    after a device-wide synchronize; ``host_ms``: the host's time to issue the call; ``blocked``:
    the call waited inside and the gate opened itself; ``escaped``: an output changed after
    the calling stream had finished (work on another stream was still writing it)."""

    gpu_ms: float
    device_ms: float
    host_ms: float
    blocked: bool = False
    escaped: bool = False


def _leaf_tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _leaf_tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _leaf_tensors(x)]
    return []


class Gate:
    """A full-GPU gate: one kernel that occupies every thread slot of every multiprocessor until
    the host raises a mapped word, then flushes L2.  ``close(timeout_s)`` enqueues it on the
    current stream; ``open()`` releases it (idempotent per call).  The gate also opens itself
    ``timeout_s`` after it started (``%globaltimer``): a call that blocks inside (a synchronize,
    a ``cudaMalloc`` that waits for the device) would otherwise wait for a gate that only its own
    return opens.  ``timed_out()`` says whether the last gate opened itself.  No host thread
    watches it: a watchdog thread woken on every call would take the interpreter's lock in the
    middle of the call and inflate the host's issue time."""

    def __init__(self, device: torch.device, flush_bytes: int) -> None:
        from cudal1.harness import cuda_api

        self._api = cuda_api
        self.host, self.dev = cuda_api.host_word()
        self._word = ctypes.c_uint32.from_address(self.host)
        self._status = ctypes.c_uint32.from_address(self.host + 8)  # the gate writes its number here on timeout
        per_sm = max(1, cuda_api.attribute("max_threads_per_sm") // 1024)
        self._buffer = torch.empty(max(16, flush_bytes) // 16 * 4, dtype=torch.int32, device=device)
        self._seq = 0
        self._launch = cuda_api.PreparedLaunch(
            cuda_api.load_function(_GATE_PTX, "cudal1_gate"), cuda_api.attribute("sm_count") * per_sm, 1024,
            [ctypes.c_uint64(self.dev), ctypes.c_uint32(0), ctypes.c_uint64(self._buffer.data_ptr()),
             ctypes.c_uint64(self._buffer.numel() // 4), ctypes.c_uint64(0), ctypes.c_uint64(self.dev + 8)])
        self._target, self._timeout_ns = self._launch.params[1], self._launch.params[4]

    def close(self, timeout_s: float) -> None:
        self._seq += 1
        self._target.value = self._seq
        self._timeout_ns.value = int(timeout_s * 1e9)
        self._launch(_current_stream().cuda_stream)

    def open(self) -> None:
        self._word.value = self._seq

    def timed_out(self) -> bool:
        """Whether the last gate opened itself (read after the device finished it)."""
        return self._status.value == self._seq


class CudaTimer:
    clock = "cuda_event"

    def __init__(self, device: torch.device, flush_l2: bool = True) -> None:
        self.device = device
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20
        self.gate = Gate(device, 2 * l2 if flush_l2 else 16)
        self.watchdog_s = 0.05  # how long the gate waits for the host before it opens itself
        self._events = [_Event(enable_timing=True) for _ in range(3)]
        self.calibration: list[float] = []  # device_ms - gpu_ms on honest busy calls (the join cost)
        self.overhead_ms = 0.0  # gpu_ms of an empty gated call (the events' own cost)
        self._reset_l2: Callable[[], None] = self.gate._api.reset_persisting_l2
        self._spin: Any = None  # the timer's spin kernel, launched by calibrate and join_probe

    def calibrate(self, n: int = 30) -> None:
        """The span of a call that launches one empty kernel (the events' cost and one launch's
        gap: what a single-kernel call adds to its kernel's own duration), and the device-wide
        join cost on busy calls (:meth:`join_probe`).  The kernel is the timer's own
        (``cudal1_spin``, in the gate's module): nothing to load on first use."""
        run = self._spin_call()
        self.overhead_ms = statistics.median(self.time_call(run, (0,))[0].gpu_ms for _ in range(n))
        self.calibration.extend(self.join_probe(n))

    def join_probe(self, n: int = 10) -> list[float]:
        """This process's device-wide join cost: ``device_ms − gpu_ms`` of ``n`` calls of a 50 µs
        spin (what the host's wake-up from the synchronize adds once a call's work has ended)."""
        run = self._spin_call()
        costs = []
        for _ in range(n):
            t, _ = self.time_call(run, (50_000,))
            costs.append(t.device_ms - t.gpu_ms)
        return costs

    def _spin_call(self) -> Callable[[int], None]:
        if self._spin is None:
            self._spin = self.gate._api.PreparedLaunch(self.gate._api.load_function(_GATE_PTX, "cudal1_spin"), 1, 1,
                                                       [ctypes.c_uint64(0)])
        spin = self._spin

        def run(ns: int) -> None:
            spin.params[0].value = ns
            spin(_current_stream().cuda_stream)

        return run

    def set_watchdog(self, host_ms: list[float]) -> None:
        """Size the gate's own timeout from the host's issue times seen so far (warm-up)."""
        self.watchdog_s = min(1.0, max(0.005, 4e-3 * max(host_ms, default=0.0)))

    def time_call(self, fn: Callable[..., Any], args: tuple, check_escape: bool = True) -> tuple[CallTiming, Any]:
        """One gated call.  ``check_escape=False`` (the clean side's own calls) still takes the
        snapshot, so both sides' device-wide spans hold the same work, but does not compare it
        afterwards (a full read of every output, after the clocks stopped)."""
        start, end, end_device = self._events
        try:
            self._reset_l2()
        except Exception:  # noqa: BLE001 - drivers without persisting L2 support
            pass
        self.gate.close(self.watchdog_s)
        start.record()
        t0 = _perf_counter_ns()
        try:
            out = fn(*args)
        finally:
            host_ms = (_perf_counter_ns() - t0) / 1e6
            end.record()
            leaves = _leaf_tensors(out) if "out" in locals() else []
            snapshot = [leaf.clone() if leaf.is_cuda else None for leaf in leaves]
            self.gate.open()
        _synchronize(self.device)
        end_device.record()
        end_device.synchronize()
        blocked = self.gate.timed_out()
        escaped = check_escape and any(s is not None and not _same_bits(s, leaf) for s, leaf in zip(snapshot, leaves))
        timing = CallTiming(start.elapsed_time(end), start.elapsed_time(end_device), host_ms, blocked, escaped)
        return timing, out


class CpuTimer:
    clock = "cpu_monotonic"

    def __init__(self, device: torch.device, flush_l2: bool = True) -> None:
        self.device = device
        self.calibration: list[float] = []
        self.overhead_ms = 0.0

    def calibrate(self, n: int = 30) -> None:
        return None

    def join_probe(self, n: int = 10) -> list[float]:
        return []

    def set_watchdog(self, host_ms: list[float]) -> None:
        return None

    def time_call(self, fn: Callable[..., Any], args: tuple, check_escape: bool = True) -> tuple[CallTiming, Any]:
        t0 = _perf_counter_ns()
        out = fn(*args)
        ms = (_perf_counter_ns() - t0) / 1e6
        return CallTiming(ms, ms, ms), out


def make_timer(device: torch.device, flush_l2: bool = True) -> CudaTimer | CpuTimer:
    return CudaTimer(device, flush_l2) if device.type == "cuda" else CpuTimer(device, flush_l2)
