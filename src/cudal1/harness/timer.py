"""Per-call timers used inside the worker; they measure, they do not judge.

CUDA protocol for one timed call (see docs/harness.md):
  device synchronize → record ``start`` → call → record ``end_stream`` → **device-wide
  synchronize** (joins every stream on the device, including streams the candidate created) →
  record ``end_device`` → wait.
``stream_ms`` (start → end_stream) measures the calling stream precisely; ``device_ms``
(start → end_device) also covers work left running on other streams, plus the host's wake-up
from the synchronize and the launch of ``end_device``.  That extra cost is only paid when the
host really waited, so :meth:`CudaTimer.calibrate` measures it on calls that keep the GPU busy
(a spin kernel), not on empty calls.  How the two clocks become a charged time and a
``side_stream`` verdict is decided from the raw samples by :func:`cudal1.harness.stats.charge`.
Work launched from other host threads after the call returns is not covered here (the
correctness phase's settle check is).

CPU protocol: ``time.perf_counter_ns`` around the call; torch CPU ops are synchronous, so the
stream and device clocks are the same number.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

# Captured before candidate code runs: a candidate rebinding these cannot change the clock.
_perf_counter_ns = time.perf_counter_ns
_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event
_SPIN_CYCLES = 100_000  # about 50 us at H200 clocks


class CudaTimer:
    clock = "cuda_event"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._events = [_Event(enable_timing=True) for _ in range(3)]
        self.calibration: list[float] = []  # device_ms - stream_ms on honest busy calls

    def calibrate(self, n: int = 30) -> None:
        spin = getattr(torch.cuda, "_sleep", None)
        if spin is None:
            return
        for _ in range(n):
            stream_ms, device_ms, _ = self.time_call(spin, (_SPIN_CYCLES,))
            self.calibration.append(device_ms - stream_ms)

    def time_call(self, fn: Callable[..., Any], args: tuple) -> tuple[float, float, Any]:
        """(stream_ms, device_ms, output) of one call."""
        start, end_stream, end_device = self._events
        _synchronize(self.device)
        start.record()
        out = fn(*args)
        end_stream.record()
        _synchronize(self.device)
        end_device.record()
        end_device.synchronize()
        return start.elapsed_time(end_stream), start.elapsed_time(end_device), out


class CpuTimer:
    clock = "cpu_monotonic"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.calibration: list[float] = []

    def calibrate(self, n: int = 30) -> None:
        return None

    def time_call(self, fn: Callable[..., Any], args: tuple) -> tuple[float, float, Any]:
        t0 = _perf_counter_ns()
        out = fn(*args)
        ms = (_perf_counter_ns() - t0) / 1e6
        return ms, ms, out


def make_timer(device: torch.device) -> CudaTimer | CpuTimer:
    return CudaTimer(device) if device.type == "cuda" else CpuTimer(device)
