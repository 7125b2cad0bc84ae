"""The timer on the GPU (:mod:`cudal1.harness.timer`): its own kernels, the calibration, the gate
keeping host latency out of a call's span, and the clean window's kernels against their host
reference (tests/test_window.py) (the ladder in ``benchmarks/timer_ladder.py`` measures fidelity
against the profiler; these check the mechanism)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def timer():
    import torch

    from cudal1.harness.timer import CudaTimer

    t = CudaTimer(torch.device("cuda", 0))
    t.calibrate()
    return t


def _spin(timer, ns: int):
    return lambda: timer.spin(ns)


def test_calibration_uses_the_timers_own_kernel(timer):
    assert 0.0 < timer.overhead_ms < 0.02  # two events and one empty kernel
    assert len(timer.calibration) == 30
    assert 0.0 <= min(timer.calibration) < 0.2  # the device-wide join after a busy call


def test_a_spin_reads_its_duration(timer):
    call = _spin(timer, 200_000)
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
        t, _ = timer.time_call(_spin(timer, 1000), ())  # the next gate closes and opens as usual
        assert not t.blocked
    finally:
        timer.watchdog_s = saved


def _window_reference():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import test_window

    return test_window


@pytest.mark.parametrize("nbytes", [16, 4096 + 7, 3 * 2**20 + 5])
def test_the_mask_kernel_is_philox_and_its_own_inverse(timer, nbytes):
    import numpy as np
    import torch

    from cudal1.harness import window

    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    key = window.new_key()
    stager = window.Stager(torch.device("cuda", 0), timer.kernels)
    stager.set_key(key)
    masked = torch.empty_like(data)
    stager.mask_into(masked, data, 5, key)
    want = _window_reference().gpu_mask_reference(data.cpu().numpy().tobytes(), key, 5)
    assert masked.cpu().numpy().tobytes() == want
    back = torch.empty_like(data)
    stager.mask_into(back, masked, 5, key)
    assert torch.equal(back, data)
    assert np.mean(masked.cpu().numpy() == data.cpu().numpy()) < 0.02


def test_the_digest_kernel_is_the_host_digest(timer):
    import torch

    from cudal1.harness import window

    stager = window.Stager(torch.device("cuda", 0), timer.kernels)
    parts = [torch.randn(1000, 1003, device="cuda"), torch.randint(0, 9, (77,), dtype=torch.int8, device="cuda")]
    want = sum(window.cpu_digest(window.raw_bytes(p).cpu().numpy()) for p in parts) % 2**64
    assert stager.digest(parts) == want
    assert stager.digest(parts) == want  # the accumulator was read and zeroed


@pytest.mark.parametrize("own_targets", [True, False], ids=["own_targets", "staged_targets"])
def test_a_windowed_call_unmasks_snapshots_digests_and_is_seen_on_the_host(timer, own_targets):
    """One call under the window in one process, as the reference worker times its own calls
    (``own_targets``) and as the candidate's process does (the snapshot staged in its own memory,
    the target filled after the clocks stopped): the private input holds the original after the
    gate (unmasked in place, as both sides do), the output lands in its target, the page holds the
    target's digest, and the host's window holds the event span plus a small slack."""
    import torch

    from cudal1.harness import window
    from cudal1.harness.timer import CallWindow

    x = torch.randn(4096, 4096, device="cuda")
    key = window.new_key()
    stager = window.Stager(torch.device("cuda", 0), timer.kernels)
    stager.set_key(key)
    mine = torch.empty_like(x)  # the masked input in the process's own memory, unmasked in place (both sides)
    stager.mask_into(mine, x, 0, key)
    assert not torch.equal(mine, x)
    target = torch.empty_like(x)
    page, seq, marks = timer.page, timer.next_seq(), {}
    page.set_key(key)
    mine * 2 + 1  # the kernel's first launch loads its module (which waits for the device): not under a gate
    torch.cuda.synchronize()

    def issued(_ms):
        marks["open"] = time.perf_counter_ns()
        page.open(seq)
        while page.done != seq:
            pass
        marks["done"] = time.perf_counter_ns()

    win = CallWindow(page, seq, [window.raw_bytes(mine)], [target], issued=issued,
                     gate_timeout_s=1.0, own_targets=own_targets)
    t, out = timer.time_call(lambda a: a * 2 + 1, (mine,), window=win)
    assert torch.equal(mine, x) and torch.equal(target, out) and torch.equal(out, x * 2 + 1)
    assert page.digest == window.cpu_digest(window.raw_bytes(target).cpu().numpy())
    window_ms = (marks["done"] - marks["open"]) / 1e6
    assert t.gpu_ms <= window_ms < t.gpu_ms + 1.0, (t.gpu_ms, window_ms)
    assert not t.blocked
