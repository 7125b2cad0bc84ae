"""The timer on the GPU (:mod:`cudal1.harness.timer`): its own kernels, the calibration, and the
gate keeping host latency out of a call's span (the ladder in ``benchmarks/timer_ladder.py``
measures fidelity against the profiler; these check the mechanism)."""

from __future__ import annotations

import ctypes
import time

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def timer():
    import torch

    from cudal1.harness.timer import CudaTimer

    t = CudaTimer(torch.device("cuda", 0))
    t.calibrate()
    return t


def _spin(ns: int):
    import torch

    from cudal1.harness import cuda_api
    from cudal1.harness.timer import _GATE_PTX

    launch = cuda_api.PreparedLaunch(cuda_api.load_function(_GATE_PTX, "cudal1_spin"), 1, 1, [ctypes.c_uint64(ns)])
    return lambda: launch(torch.cuda.current_stream().cuda_stream)


def test_calibration_uses_the_timers_own_kernel(timer):
    assert 0.0 < timer.overhead_ms < 0.02  # two events and one empty kernel
    assert len(timer.calibration) == 30
    assert 0.0 <= min(timer.calibration) < 0.2  # the device-wide join after a busy call


def test_a_spin_reads_its_duration(timer):
    call = _spin(200_000)
    spans = [timer.time_call(call, ())[0] for _ in range(10)]
    assert not any(t.blocked or t.escaped for t in spans)
    gpu = sorted(t.gpu_ms - timer.overhead_ms for t in spans)[5]
    assert abs(gpu - 0.2) < 0.01, gpu


def test_host_latency_stays_out_of_the_span(timer):
    import torch

    x = torch.ones(1 << 20, device="cuda")
    x * 2  # the kernel's first launch loads its module (tens of milliseconds): not what this measures
    torch.cuda.synchronize()

    def slow_host():
        time.sleep(0.002)  # the host dawdles before it launches: the gate holds the GPU meanwhile
        return x * 2

    t, out = timer.time_call(slow_host, ())
    assert t.host_ms >= 2.0 and t.gpu_ms < 0.5 and not t.blocked
    assert torch.equal(out, x * 2)


def test_a_call_that_waits_inside_opens_the_gate_and_says_so(timer):
    import torch

    def waits():
        torch.cuda.synchronize()  # cannot finish while the gate is closed
        return torch.ones(4, device="cuda")

    saved, timer.watchdog_s = timer.watchdog_s, 0.01
    try:
        t, _ = timer.time_call(waits, ())
        assert t.blocked
        t, _ = timer.time_call(_spin(1000), ())  # the next gate closes and opens as usual
        assert not t.blocked
    finally:
        timer.watchdog_s = saved
