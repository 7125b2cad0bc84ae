"""Per-call timers used inside the worker.

CUDA protocol for one timed call (see docs/harness.md):
  device synchronize → record ``start`` → call → record ``end_stream`` → **device-wide
  synchronize** (joins every stream on the device, including streams the candidate created) →
  record ``end_device`` → wait.
``end_stream`` measures the calling stream precisely; ``end_device`` additionally counts work the
candidate left running on other streams, at the price of a fixed synchronisation overhead that
is calibrated on an empty call and subtracted.  A call is charged
``max(stream_ms, device_ms - overhead_ms)`` when the excess is above noise, so side-stream work
cannot escape the timer; calls where it happens are counted as ``escaped`` (flag ``side_stream``).
Work launched from other host threads after the call returns is not covered here (thread guard).

CPU protocol: ``time.perf_counter_ns`` around the call; torch CPU ops are synchronous.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

# Captured before candidate code runs: a candidate rebinding these cannot change the clock.
_perf_counter_ns = time.perf_counter_ns
_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event


@dataclass
class CallTime:
    ms: float  # charged time
    stream_ms: float  # calling stream only (CUDA) or host clock (CPU)
    escaped: bool  # device-wide time exceeded the stream time beyond noise


class CudaTimer:
    clock = "cuda_event"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._events = [_Event(enable_timing=True) for _ in range(3)]
        self.overhead_ms = 0.0
        self.slack_ms = 0.005

    def calibrate(self, n: int = 30) -> None:
        """Measure the fixed cost of the device-wide join on an empty call."""
        excess = []
        for _ in range(n):
            ct = self._raw(lambda: None, ())
            excess.append(ct[1] - ct[0])
        excess.sort()
        self.overhead_ms = statistics.median(excess)
        q1, q3 = excess[len(excess) // 4], excess[(3 * len(excess)) // 4]
        self.slack_ms = max(0.005, 3 * (q3 - q1), 0.5 * self.overhead_ms)

    def _raw(self, fn: Callable[..., Any], args: tuple) -> tuple[float, float, Any]:
        start, end_stream, end_device = self._events
        _synchronize(self.device)
        start.record()
        out = fn(*args)
        end_stream.record()
        _synchronize(self.device)
        end_device.record()
        end_device.synchronize()
        return start.elapsed_time(end_stream), start.elapsed_time(end_device), out

    def time_call(self, fn: Callable[..., Any], args: tuple) -> tuple[CallTime, Any]:
        stream_ms, device_ms, out = self._raw(fn, args)
        excess = device_ms - self.overhead_ms
        escaped = excess > stream_ms + self.slack_ms
        return CallTime(max(stream_ms, excess) if escaped else stream_ms, stream_ms, escaped), out


class CpuTimer:
    clock = "cpu_monotonic"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.overhead_ms = 0.0

    def calibrate(self, n: int = 30) -> None:
        return None

    def time_call(self, fn: Callable[..., Any], args: tuple) -> tuple[CallTime, Any]:
        t0 = _perf_counter_ns()
        out = fn(*args)
        ms = (_perf_counter_ns() - t0) / 1e6
        return CallTime(ms, ms, False), out


def make_timer(device: torch.device) -> CudaTimer | CpuTimer:
    return CudaTimer(device) if device.type == "cuda" else CpuTimer(device)
