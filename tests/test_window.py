"""The clean window's pieces that run without a GPU (harness.window, harness.timer_ptx, the
gate's wait in harness.timer.GateWait, and the parent's check in harness.figures.window_check);
the GPU kernels are checked against the reference implementation below in
tests/gpu/test_timer_gpu.py."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from cudal1.harness import window
from cudal1.harness.figures import window_check
from cudal1.harness.timer_ptx import PTX

_M0, _M1, _W0, _W1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)


def philox4x32(counters: np.ndarray, k0: int, k1: int) -> np.ndarray:
    """Philox-4x32-10 over rows of four uint32 counters: what ``cudal1_mask`` XORs in."""
    c = [counters[:, i].astype(np.uint32) for i in range(4)]
    key0, key1 = np.uint32(k0), np.uint32(k1)
    with np.errstate(over="ignore"):
        for _ in range(10):
            p0, p1 = _M0 * c[0].astype(np.uint64), _M1 * c[2].astype(np.uint64)
            hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), p0.astype(np.uint32)
            hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), p1.astype(np.uint32)
            c = [hi1 ^ c[1] ^ key0, lo1, hi0 ^ c[3] ^ key1, lo0]
            key0, key1 = np.uint32(key0 + _W0), np.uint32(key1 + _W1)
    return np.stack(c, axis=1)


def gpu_mask_reference(data: bytes, key: tuple[int, int, int, int], lane: int) -> bytes:
    """``cudal1_mask``'s output computed on the host (timer_kernels.cu: chunk i of 16 bytes is XORed
    with philox((i, i >> 32, lane ^ key[2], key[3]), (key[0], key[1]))."""
    n = len(data)
    chunks = (n + 15) // 16
    idx = np.arange(chunks, dtype=np.uint64)
    ctr = np.stack([idx & np.uint64(0xFFFFFFFF), idx >> np.uint64(32), np.full(chunks, lane ^ key[2], np.uint64),
                    np.full(chunks, key[3], np.uint64)], axis=1)
    stream = philox4x32(ctr, key[0], key[1]).astype("<u4").tobytes()[:n]
    return bytes(a ^ b for a, b in zip(data, stream)) if n < 64 else (
        np.frombuffer(data, np.uint8) ^ np.frombuffer(stream, np.uint8)).tobytes()


def test_philox_reference_matches_the_published_answers():
    # Random123's known-answer vectors for philox4x32-10
    zero = philox4x32(np.zeros((1, 4), np.uint64), 0, 0)[0]
    assert [int(x) for x in zero] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    pi = philox4x32(np.array([[0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]], np.uint64), 0xA4093822, 0x299F31D0)[0]
    assert [int(x) for x in pi] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_cpu_mask_is_its_own_inverse_and_needs_the_key():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 4099, dtype=np.uint8)  # not a multiple of 8 or 16
    key = window.new_key()
    masked, back = np.empty_like(data), np.empty_like(data)
    window.cpu_mask(data, masked, key, 3)
    window.cpu_mask(masked, back, key, 3)
    assert np.array_equal(back, data)
    assert np.mean(masked == data) < 0.02  # about 1/256 of the bytes agree by chance
    inplace = masked.copy()
    window.cpu_mask(inplace, inplace, key, 3)  # in place, as both sides unmask their inputs
    assert np.array_equal(inplace, data)
    other, lane = np.empty_like(data), np.empty_like(data)
    window.cpu_mask(masked, other, window.new_key(), 3)
    window.cpu_mask(masked, lane, key, 4)
    assert np.mean(other == data) < 0.02 and np.mean(lane == data) < 0.02


def test_cpu_digest_is_the_kernels_sum():
    rng = np.random.default_rng(1)
    for n in (0, 5, 8, 4096, 4101):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        want = 0
        for i in range((n + 7) // 8):
            want += int.from_bytes(bytes(data[8 * i:8 * i + 8]), "little") * (2 * i + 1)
        assert window.cpu_digest(data) == want % 2**64, n
    flipped = rng.integers(0, 256, 4096, dtype=np.uint8)
    before = window.cpu_digest(flipped)
    flipped[1000] ^= 1
    assert window.cpu_digest(flipped) != before


def test_a_page_orders_key_before_the_number_and_reads_back():
    page = window.cpu_page()
    page.open(7, (1, 2, 3, 4))
    assert page.opened == 7 and page.key() == (1, 2, 3, 4)
    page.publish(7, 2**64 - 5)
    assert page.done == 7 and page.digest == 2**64 - 5


def test_a_shared_page_is_seen_through_another_mapping():
    fd = window.shared_page()
    try:
        a, b = window.attach(fd), window.attach(fd)
        a.open(3, (9, 9, 9, 9))
        assert b.opened == 3 and b.key() == (9, 9, 9, 9)
    finally:
        import os

        os.close(fd)


def test_the_ptx_holds_the_judges_kernels_and_an_old_enough_isa():
    assert set(re.findall(r"\.entry (\w+)", PTX)) == {"cudal1_gate", "cudal1_mask", "cudal1_flush", "cudal1_digest",
                                                      "cudal1_publish", "cudal1_spin"}
    assert re.search(r"^\.version 7\.8$", PTX, re.M) and re.search(r"^\.target sm_75$", PTX, re.M)


@pytest.mark.cpu
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) is not installed")
@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_the_ptx_assembles(tmp_path, arch):
    src = tmp_path / "k.ptx"
    src.write_text(PTX)
    subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(tmp_path / "k.cubin")], check=True)


# ---- the parent's check ---------------------------------------------------------------------------
def _rows(n: int, span: float, slack: float, jitter: float = 0.001, seed: int = 0, lie: float = 1.0) -> list[list]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        true = span * (1 + rng.uniform(-0.01, 0.01))
        window_ms = true + slack + rng.uniform(0, jitter)
        rows.append([true * lie, true * lie, 0.01, False, False, window_ms])
    return rows


def test_an_honest_candidate_fits_its_window():
    out = window_check({"ref": _rows(50, 2.7, 0.05), "cand": _rows(50, 2.7, 0.05, seed=1)}, "cuda_event")
    assert out["checked"] and "mismatch" not in out
    assert abs(out["excess_ms"]) < 0.005 and out["bound_ms"] < 0.08


@pytest.mark.parametrize("lie", [0.5, 0.8])
def test_a_fifth_hidden_from_a_millisecond_call_is_a_mismatch(lie):
    out = window_check({"ref": _rows(50, 1.0, 0.05), "cand": _rows(50, 1.0, 0.05, seed=1, lie=lie)}, "cuda_event")
    assert "mismatch" in out and out["excess_ms"] == pytest.approx(1.0 - lie, rel=0.05)


def test_a_slack_of_gigabyte_copies_adds_nothing_to_the_bound():
    # level1/38 on an H200: 8.6 GB in and out, a 10.8 ms slack on both sides (excess -0.003 ms, 2026-12-03)
    ref = _rows(50, 12.0, 10.77, jitter=0.05)
    out = window_check({"ref": ref, "cand": _rows(50, 12.0, 10.77, jitter=0.05, seed=1)}, "cuda_event")
    assert "mismatch" not in out and abs(out["excess_ms"]) < 0.02
    small = window_check({"ref": _rows(50, 12.0, 0.05, jitter=0.05),
                          "cand": _rows(50, 12.0, 0.05, jitter=0.05, seed=1)}, "cuda_event")
    assert out["bound_ms"] == pytest.approx(small["bound_ms"], abs=0.01)
    # a twentieth of the call hidden (0.6 ms), which a share of the slack in the bound let through, is caught
    lie = _rows(50, 12.0, 10.77, jitter=0.05, seed=1, lie=0.95)
    assert "mismatch" in window_check({"ref": ref, "cand": lie}, "cuda_event")
    # on the host only the floor and the share differ (they cover the host's own steps)
    host = window_check({"ref": ref, "cand": _rows(50, 12.0, 10.77, jitter=0.05, seed=1)}, "cpu_monotonic")
    reported = out["bound_ms"] / out["bound_share"]
    assert host["bound_ms"] - out["bound_ms"] == pytest.approx((5.0 - 0.02) + (0.15 - 0.01) * reported, rel=1e-6)


def test_short_calls_state_the_bound_they_could_enforce():
    out = window_check({"ref": _rows(50, 0.002, 0.03), "cand": _rows(50, 0.002, 0.03, seed=1)}, "cuda_event")
    assert "mismatch" not in out and out["bound_share"] > 1  # a 2 us call: only lies above the bound are seen


def test_blocked_calls_and_missing_windows_are_left_out():
    ref, cand = _rows(50, 1.0, 0.05), _rows(50, 1.0, 0.05, seed=1, lie=0.5)
    for r in cand:
        r[3] = True  # every call blocked: the window held host gaps, not a measure of the call
    assert window_check({"ref": ref, "cand": cand}, "cuda_event") == {"checked": False, "calls": 0}
    assert not window_check({"ref": [r[:5] for r in ref], "cand": _rows(50, 1.0, 0.05)}, "cuda_event")["checked"]


def test_the_host_bound_is_looser():
    ref, cand = _rows(30, 20.0, 1.0, jitter=0.5), _rows(30, 20.0, 1.0, jitter=0.5, seed=1, lie=0.85)
    assert "mismatch" not in window_check({"ref": ref, "cand": cand}, "cpu_monotonic")  # 3 ms under an 8.5 ms bound
    assert "mismatch" in window_check({"ref": ref, "cand": _rows(30, 20.0, 1.0, 0.5, 1, 0.5)}, "cpu_monotonic")


@pytest.mark.parametrize("share", [0.05, 0.45])
def test_a_contended_host_turns_a_window_excess_into_an_untrusted_verdict(share):
    """On the CPU clock the check subtracts the judge's run-queue waits; on a contended host they
    swing too far for an excess to be evidence (an A/A pair beside two spinning processes read
    slacks 50 ms apart): the verdict is ``contended`` (not trusted) instead of ``rejected``.  On a
    quiet host the same excess is rejected, and a report longer than its window is rejected on a
    contended host too, as is an excess on a GPU's clock."""
    from cudal1.config import EvalConfig
    from cudal1.harness.parent.assemble import _timings
    from cudal1.harness.spec import TimingStage
    from cudal1.speedup import faster
    from cudal1.types import EvalResult, Status

    load = {"wait_share": {"ref": [share] * 6, "cand": [share] * 6}, "cpus": 2, "runnable": [3] * 6}

    def judged(clock, block_ms, ref, cand, timing_figure="gpu"):
        stage = TimingStage(clock=clock, ref=ref, cand=cand, blocks=[["ref", 30, block_ms], ["cand", 30, block_ms]],
                            load=load)
        r = EvalResult(Status.OK)
        _timings(stage, EvalConfig(timing_figure=timing_figure), r)
        return r

    # 10 ms of each 20 ms call left out of its report
    r = judged("cpu_monotonic", 600.0, _rows(30, 20.0, 1.0, 0.5), _rows(30, 20.0, 1.0, 0.5, 1, 0.5))
    if share < 0.25:
        assert r.status is Status.REJECTED and "timing_mismatch" in r.flags and "leaves out" in r.message
    else:
        assert r.status is Status.OK and "contended" in r.flags and "timing_mismatch" not in r.flags
        assert "nor could the clean window check its reports (the clean side's window holds" in r.message
        assert not faster(r)
    longer = _rows(30, 20.0, 1.0, 0.5, 1)
    longer[0][0] = longer[0][5] + 1.0  # a call reported longer than the window it ran in
    r = judged("cpu_monotonic", 600.0, _rows(30, 20.0, 1.0, 0.5), longer)
    assert r.status is Status.REJECTED and "inside a clean window" in r.message
    # on a GPU's clock the same excess is rejected however loaded the host (the host figure included)
    r = judged("cuda_event", 30.0, _rows(30, 1.0, 0.05), _rows(30, 1.0, 0.05, seed=1, lie=0.5), timing_figure="host")
    assert r.status is Status.REJECTED and "timing_mismatch" in r.flags


def test_a_channels_last_output_travels_in_storage_order(tmp_path):
    """A dense output in another layout is snapshotted as its storage lies (a plain copy, the
    same work as a contiguous output's) and read back by the clean side with its strides; an
    expanded view is copied element by element; strides that do not describe the slot are refused."""
    import torch

    from cudal1.harness.slots import SlotMap, SlotPool
    from cudal1.harness.timer import _snapshot
    from cudal1.harness.wire import WireError, decode_outputs, encode_outputs, output_targets, storage_order

    ref = torch.randn(2, 3, 4, 5)
    pool = SlotPool(torch.device("cpu"), tmp_path)
    targets = output_targets((ref, ref[0]), pool, [])
    slots = SlotMap(torch.device("cpu"))
    slots.update([s.describe() for s in pool.slots.values()])
    out = (ref.to(memory_format=torch.channels_last), ref[0, :, :1, :].expand(3, 4, 5))  # dense; expanded
    assert storage_order(out[0]) is not None and storage_order(out[0]).is_contiguous()
    assert storage_order(out[1]) is None
    desc = encode_outputs(out, targets, slots, "cpu")
    node = desc["items"][0]
    assert node["strides"] == list(out[0].stride())
    first = slots.tensor(targets[0])
    assert torch.equal(first.reshape(-1), out[0].permute(0, 2, 3, 1).reshape(-1))  # storage order in the slot
    back = decode_outputs(desc, pool)
    assert torch.equal(back[0], ref) and back[0].is_contiguous() and torch.equal(back[1], out[1])
    assert "strides" not in desc["items"][1]
    snap = torch.empty(2, 3, 4, 5)
    _snapshot(snap, out[0])
    assert torch.equal(snap, first)
    node["strides"] = [60, 20, 5, 2]  # overlapping
    with pytest.raises(WireError):
        decode_outputs(desc, pool)


def test_waits_of_a_busy_host_are_not_hidden_time():
    """A candidate whose window carries run-queue waits (its process woke late on a busy host) has
    slack beyond the reference's, but not hidden in its report: the waits are taken out."""
    ref = _rows(30, 20.0, 1.0, jitter=0.2)
    late = [r + [9.0] for r in _rows(30, 20.0, 10.0, jitter=0.2, seed=1)]  # 9 ms of waiting per call
    assert "mismatch" in window_check({"ref": ref, "cand": [r[:6] for r in late]}, "cpu_monotonic")
    assert "mismatch" not in window_check({"ref": ref, "cand": late}, "cpu_monotonic")
    lying = [r + [0.0] for r in _rows(30, 20.0, 1.0, jitter=0.2, seed=1, lie=0.5)]
    assert "mismatch" in window_check({"ref": ref, "cand": lying}, "cpu_monotonic")


def test_a_side_that_blocks_every_call_waits_less_after_two_and_figures_nothing_from_it():
    from cudal1.harness.timer import GateWait, gate_wait_s

    assert gate_wait_s([10.0, 47.0]) == pytest.approx(0.188) and gate_wait_s([47.0], 1.0) == pytest.approx(0.047)
    assert gate_wait_s([]) == 0.005 and gate_wait_s([900.0]) == 1.0  # 5 ms to 1 s
    wait = GateWait([10.0, 47.0])
    seen = []
    for blocked in (True, True, True, True, False, True, False):
        seen.append(wait.wait_s())
        wait.saw(blocked)
    # two blocked calls in a row shorten the wait to the longest warm-up issue time; a call issued in
    # time restores the full wait, and a single blocked call (a one-off allocation, say) keeps it
    assert seen == pytest.approx([0.188, 0.188, 0.047, 0.047, 0.047, 0.188, 0.188])
    assert wait.shortened == 3
    cpu = GateWait([10.0, 47.0], shortens=False)  # the CPU protocol has no gate to wait on
    for _ in range(4):
        cpu.saw(True)
    assert cpu.wait_s() == pytest.approx(0.188) and cpu.shortened == 0


def test_blocked_calls_are_counted_per_side_on_the_gpu_clock():
    """Each side's blocked calls (row[3]: the gate opened without the call) are kept in
    ``figures["blocked_calls"]`` with each side's number of calls; none blocked, no figure."""
    from cudal1.config import EvalConfig
    from cudal1.harness.parent.assemble import _timings
    from cudal1.harness.spec import TimingStage
    from cudal1.types import EvalResult, Status

    def judged(cand_blocked: int) -> EvalResult:
        cand = _rows(30, 2.0, 0.05, seed=1)
        for row in cand[:cand_blocked]:
            row[3] = True
        stage = TimingStage(clock="cuda_event", ref=_rows(30, 2.0, 0.05), cand=cand,
                            blocks=[["ref", 30, 70.0], ["cand", 30, 70.0]])
        r = EvalResult(Status.OK)
        _timings(stage, EvalConfig(), r)
        return r

    assert judged(18).figures["blocked_calls"] == {"reference": 0, "candidate": 18,
                                                   "calls": {"reference": 30, "candidate": 30}}
    assert "blocked_calls" not in judged(0).figures
