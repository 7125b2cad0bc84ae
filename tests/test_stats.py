"""harness.figures and harness.parent.stats: bootstrap confidence intervals, speedup, and two-clock charging."""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest

from cudal1.harness.parent.stats import bootstrap_speedup_ci, speedup


class TestBootstrap:
    def _clean(self, n: int = 40):
        ref = [10.0 + 0.01 * ((i * 7) % 11) for i in range(n)]
        cand = [5.0 + 0.01 * ((i * 5) % 13) for i in range(n)]
        return ref, cand

    def test_ci_contains_point_estimate(self):
        import statistics

        ref, cand = self._clean()
        point = speedup(statistics.median(ref), statistics.median(cand))
        lo, hi = bootstrap_speedup_ci(ref, cand, samples=1000, seed=0)
        assert lo <= point <= hi
        assert lo < hi
        assert 1.9 < lo and hi < 2.1

    def test_constant_samples_give_a_degenerate_interval(self):
        lo, hi = bootstrap_speedup_ci([4.0] * 10, [2.0] * 10)
        assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)

    @pytest.mark.parametrize("ref,cand", [([], [1.0, 2.0]), ([1.0], [1.0, 2.0]), ([1.0, 2.0], [1.0]), ([1.0], [1.0])])
    def test_fewer_than_two_samples(self, ref, cand):
        assert bootstrap_speedup_ci(ref, cand) is None

    def test_deterministic_with_seed(self):
        rng = __import__("random").Random(1)
        ref = [rng.uniform(9, 11) for _ in range(30)]
        cand = [rng.uniform(4, 6) for _ in range(30)]
        a = bootstrap_speedup_ci(ref, cand, samples=500, seed=123)
        b = bootstrap_speedup_ci(ref, cand, samples=500, seed=123)
        c = bootstrap_speedup_ci(ref, cand, samples=500, seed=124)
        assert a == b
        assert a != c

    def test_speedup(self):
        assert speedup(10.0, 2.0) == 5.0
        assert math.isfinite(speedup(1.0, 0.0))


class TestFigures:
    """stats.figures: both processes' raw rows -> the gpu/host figures and the parent's findings."""

    def _rows(self, n=50, gpu=0.1, base=0.02, host=0.01, jitter=0.002, wall=None, seed=0):
        import random as _r

        rng = _r.Random(seed)
        rows = []
        for _ in range(n):
            g = gpu + rng.uniform(-0.005, 0.005)
            row = [g, g + base + rng.uniform(0, jitter), host, False, False]
            if wall is not None:
                row.append(wall)
            rows.append(row)
        return rows

    def _stage(self, ref, cand, blocks=None, overhead=0.0, physics=None, calibration=None):
        from cudal1.harness.spec import TimingStage

        return TimingStage(clock="cuda_event", ref=ref, cand=cand, blocks=blocks or [], overhead_ms=overhead,
                           calibration=calibration if calibration is not None else [0.02] * 30, physics_ms=physics)

    def test_honest_candidate_keeps_its_calling_stream_time(self):
        from cudal1.harness.figures import figures

        f = figures(self._stage(self._rows(gpu=0.3), self._rows(gpu=0.1, wall=1.0), overhead=0.003))
        assert not f.side_stream and not f.timing_mismatch and not f.below_physics and not f.launch_bound
        assert abs(np.median(f.gpu["cand"]) - 0.097) < 0.005  # the events' own cost is taken off

    def test_work_left_on_another_stream_is_charged_and_flagged(self):
        from cudal1.harness.figures import figures

        cand = self._rows(gpu=0.01, wall=1.0)
        for r in cand:
            r[1] += 0.25  # 0.25 ms still running on another stream after the calling stream ended
        f = figures(self._stage(self._rows(gpu=0.3), cand))
        assert f.side_stream
        assert np.median(f.gpu["cand"]) > 0.25

    def test_a_late_wake_up_on_some_calls_is_not_charged(self):
        from cudal1.harness.figures import figures

        cand = self._rows(gpu=0.002, wall=1.0)
        for r in cand[::3]:
            r[1] += 0.04  # the host woke 40 us late after the synchronize on a third of the calls
        f = figures(self._stage(self._rows(gpu=0.005), cand))
        assert not f.side_stream
        assert abs(np.median(f.gpu["cand"]) - 0.002) < 0.004  # a short call keeps its own time
        everywhere = self._rows(gpu=0.002, wall=1.0)
        for r in everywhere:
            r[1] += 0.04  # 40 us later on every call: below the side-stream floor, so not charged (the host's
            # wake-up differs between processes; work the outputs depend on is inside the clean window)
        f = figures(self._stage(self._rows(gpu=0.005), everywhere))
        assert not f.side_stream and np.median(f.gpu["cand"]) < 0.01 and f.charged_ms["cand"] == 0.0

    def test_the_join_cost_and_its_charges_are_reported(self):
        from cudal1.harness.figures import figures

        cand = self._rows(gpu=0.01, wall=1.0)
        for r in cand:
            r[1] += 0.3
        stage = self._stage(self._rows(gpu=0.3), cand)
        stage.cand_join = [0.05, 0.05, 0.06]
        f = figures(stage)
        assert f.side_stream and f.charged_ms["ref"] == 0.0 and 0.295 < f.charged_ms["cand"] < 0.305
        assert f.join_probe_ms == {"ref": 0.02, "cand": 0.05}
        assert abs(np.median(f.gpu["cand"]) - (0.01 + f.charged_ms["cand"])) < 0.006  # the probe changes no figure
        stage.cand_join = []
        assert figures(stage).join_probe_ms["cand"] is None

    def test_an_output_written_after_the_call_is_side_stream(self):
        from cudal1.harness.figures import figures

        cand = self._rows(gpu=0.1, wall=1.0)
        cand[3][4] = True  # escaped: the snapshot differed from the output after the join
        assert "returned before their output was written" in figures(self._stage(self._rows(gpu=0.3), cand)).side_stream

    def test_an_escaped_call_is_charged_its_own_join_whatever_the_noise(self):
        """Every call escaped, the reference's join noisy (a busy host): the median excess is below
        the slack, yet each escaped call carries the work that outlived it."""
        from cudal1.harness.figures import figures

        ref = self._rows(gpu=0.3)
        for i, r in enumerate(ref):
            r[1] += 0.15 * (i % 10 < 3)  # the reference's host woke 150 us late after the join on 3 calls in 10
        cand = self._rows(gpu=0.001, wall=1.0)
        for r in cand:
            r[1] += 0.12  # the side stream's work ran 120 us past the calling stream
            r[4] = True
        f = figures(self._stage(ref, cand))
        assert f.charged_ms["cand"] == 0.0  # below the noise as a median...
        assert np.median(f.gpu["cand"]) > 0.1  # ...but each escaped call shows what it took
        assert "returned before their output was written" in f.side_stream

    def test_an_escaped_call_is_charged_the_work_its_output_snapshot_hid_in(self):
        """The H200 case: the reference's join holds a 150 us output snapshot, and the candidate's
        snapshot ran beside its escaped 220 us side-stream work.  The escaped calls are charged
        their excess over the bare join (the calibration), not over the reference's join: about
        the side work's time, not its difference from the snapshot."""
        from cudal1.harness.figures import figures

        ref = self._rows(gpu=0.22, base=0.17)  # wake-up 20 us + snapshot 150 us
        cand = self._rows(gpu=0.001, wall=1.0, base=0.24)  # the side work (220 us) hid the snapshot
        for r in cand:
            r[4] = True
        f = figures(self._stage(ref, cand))
        assert "returned before their output was written" in f.side_stream
        assert np.median(f.gpu["cand"]) >= 0.5 * np.median(f.gpu["ref"])
        assert 0.2 < np.median(f.gpu["cand"]) < 0.25

    def test_reported_times_must_fit_the_clean_clock(self):
        from cudal1.harness.figures import figures

        per_call = figures(self._stage(self._rows(gpu=0.3), self._rows(gpu=0.1, wall=0.05)))
        assert "inside a clean window" in per_call.timing_mismatch
        rows = self._rows(n=4, gpu=0.1, wall=1.0)
        block = figures(self._stage(self._rows(n=4, gpu=0.3), rows, blocks=[["ref", 4, 5.0], ["cand", 4, 0.2]]))
        assert "timing block" in block.timing_mismatch
        fits = figures(self._stage(self._rows(n=4, gpu=0.3), rows, blocks=[["ref", 4, 5.0], ["cand", 4, 4.0]]))
        assert not fits.timing_mismatch

    def test_faster_than_writing_the_outputs_is_below_the_physical_limit(self):
        from cudal1.harness.figures import figures

        f = figures(self._stage(self._rows(gpu=0.3), self._rows(gpu=0.01, wall=1.0), physics=0.05))
        assert "peak bandwidth" in f.below_physics
        assert not figures(self._stage(self._rows(gpu=0.3), self._rows(gpu=0.1, wall=1.0), physics=0.05)).below_physics

    def test_host_figure_and_launch_bound(self):
        from cudal1.harness.figures import figures

        f = figures(self._stage(self._rows(gpu=0.3, host=0.05), self._rows(gpu=0.02, host=0.2, wall=1.0)))
        assert f.launch_bound == "candidate"
        assert np.median(f.host["cand"]) >= 0.2 and np.median(f.gpu["cand"]) < 0.05
        assert np.median(f.host["ref"]) == pytest.approx(np.median(f.gpu["ref"]))

    def test_cpu_rows_agree(self):
        from cudal1.harness.figures import figures
        from cudal1.harness.spec import TimingStage

        stage = TimingStage(clock="cpu_monotonic", ref=[[1.0, 1.0, 1.0, False, False]] * 3,
                            cand=[[0.5, 0.5, 0.5, False, False, 0.6]] * 3)
        f = figures(stage)
        assert f.gpu["cand"] == [0.5] * 3 == f.host["cand"] and not f.side_stream and not f.launch_bound


def test_a_contended_verdict_is_never_faster():
    from cudal1.speedup import faster
    from cudal1.types import EvalResult, Status

    sure = EvalResult(status=Status.OK, speedup=2.0, speedup_ci=(1.8, 2.2))
    assert faster(sure)
    sure.flags = ["contended"]
    assert not faster(sure)  # the GPU was shared while it was timed: its figure is not trusted


class TestPairedInterval:
    """stats.speedup_ci: the CI follows the alternating blocks (rounds), never narrower than the
    pooled bootstrap; stats.host_contention reads the worker's per-block wait shares."""

    def _rounds(self, n_rounds, per_block=5, drift=0.0, seed=0):
        rng = np.random.default_rng(seed)
        ref, cand, blocks = [], [], []
        for k in range(n_rounds):
            level = 1.0 + drift * rng.standard_normal()  # what the host did to this round, both blocks alike
            shift = drift * rng.standard_normal()  # ... and what it did to one block only
            ref += list(10.0 * level * (1 + shift) + 0.05 * rng.standard_normal(per_block))
            cand += list(10.0 * level + 0.05 * rng.standard_normal(per_block))
            blocks += [["ref", per_block, 1.0], ["cand", per_block, 1.0]] if k % 2 else [["cand", per_block, 1.0],
                                                                                         ["ref", per_block, 1.0]]
        return ref, cand, blocks

    def test_rounds_pair_blocks_in_either_order(self):
        from cudal1.harness.parent.stats import rounds

        assert rounds([["cand", 5, 1], ["ref", 5, 1], ["ref", 3, 1], ["cand", 3, 1]]) == [((0, 5), (0, 5)),
                                                                                            ((5, 8), (5, 8))]

    def test_steady_rounds_keep_the_pooled_width(self):
        from cudal1.harness.parent.stats import speedup_ci

        ref, cand, blocks = self._rounds(20)
        pooled = bootstrap_speedup_ci(ref, cand)
        paired = speedup_ci(ref, cand, blocks)
        assert paired[0] <= pooled[0] and paired[1] >= pooled[1]
        assert paired[1] - paired[0] < 2 * (pooled[1] - pooled[0]) + 0.01

    def test_rounds_that_disagree_widen_it_past_one(self):
        from cudal1.harness.parent.stats import speedup_ci

        ref, cand, blocks = self._rounds(8, drift=0.3, seed=3)  # an identical program on a loaded host
        pooled = bootstrap_speedup_ci(ref, cand)
        assert pooled[1] < 1.0  # the calls taken as independent: "slower", with confidence
        lo, hi = speedup_ci(ref, cand, blocks)
        assert lo < 1.0 < hi and hi - lo > 1.5 * (pooled[1] - pooled[0])

    def test_few_rounds_fall_back_to_the_pooled_bootstrap(self):
        from cudal1.harness.parent.stats import speedup_ci

        ref, cand, blocks = self._rounds(3, drift=0.3)
        assert speedup_ci(ref, cand, blocks) == bootstrap_speedup_ci(ref, cand)

    def test_a_block_load_read_per_call_counts_only_the_calls(self):
        """Per call (the CPU clock), a block's wait share is the calls' own: what the two
        processes wait for each other between calls is left out."""
        from cudal1.harness.reference.hostload import BlockLoad

        load = BlockLoad(per_call=True)
        load.begin(os.getpid())
        load.add((900, 100))
        load.add((1000, 0))
        load.add(None)  # a call whose counters could not be read
        load.end("cand", os.getpid())
        assert load.wait_share["cand"] == [0.05]
        whole = BlockLoad()
        whole.begin(os.getpid())
        whole.add((900, 100))  # ignored: not per call
        t = time.perf_counter()
        while time.perf_counter() - t < 0.01:  # this thread runs: the block's counters move
            pass
        whole.end("ref", os.getpid())
        assert len(whole.wait_share["ref"]) == 1 and whole.wait_share["ref"][0] != 0.1

    def test_host_contention_from_wait_shares(self):
        from cudal1.harness.parent.stats import host_contention

        quiet = host_contention(
            {"wait_share": {"ref": [0.0, 0.01], "cand": [0.02, 0.0]}, "runnable": [1, 2], "cpus": 2}
        )
        assert quiet["contended"] is False and quiet["runnable"] == 1.5
        busy = host_contention({"wait_share": {"ref": [0.4, 0.5, 0.45], "cand": [0.05]}, "runnable": [4], "cpus": 2})
        assert busy["contended"] is True and busy["wait_share"]["reference"] == 0.45
        assert host_contention({}) == {}


def test_a_cpu_verdict_claims_only_beyond_its_margin():
    from cudal1.speedup import CPU_MARGIN, CPU_SLOWER_MARGIN, faster, slower
    from cudal1.types import EvalResult, Status

    near = EvalResult(status=Status.OK, speedup=0.94, speedup_ci=(0.92, 0.96), flags=["cpu_timing"])
    assert not slower(near) and not faster(near)  # within the CPU clock's few percent of protocol bias
    near.flags = []
    assert slower(near)  # on the GPU clock the same interval is slower
    far = EvalResult(status=Status.OK, speedup=1.5, speedup_ci=(1 + CPU_MARGIN + 0.05, 1.7), flags=["cpu_timing"])
    assert faster(far)
    # the bias runs against the candidate: an identical program's verdict read a CI whose top was
    # 0.845 on a quiet 2-core VM; "slower" on the CPU needs the CI below 1 - CPU_SLOWER_MARGIN
    biased = EvalResult(status=Status.OK, speedup=0.78, speedup_ci=(0.70, 0.845), flags=["cpu_timing"])
    assert not slower(biased) and 1 - CPU_SLOWER_MARGIN < 0.845 < 1 - CPU_MARGIN
    clearly = EvalResult(status=Status.OK, speedup=0.6, speedup_ci=(0.5, 1 - CPU_SLOWER_MARGIN - 0.05),
                         flags=["cpu_timing"])
    assert slower(clearly)


def test_a_cpu_verdict_claims_nothing_on_calls_closer_than_the_per_call_floor():
    """An identical 20 us program read 0.66-0.69x on the CPU clock, CI well under 0.80: its calls
    were about 0.011 ms longer in the candidate's process.  Medians closer than the floor claim
    neither way; the GPU clock has no such floor."""
    from cudal1.speedup import CPU_CALL_FLOOR_MS, faster, slower
    from cudal1.types import EvalResult, Status, Timing

    def timing(ms: float) -> Timing:
        return Timing(median_ms=ms, iqr_ms=0.0, mean_ms=ms, min_ms=ms, trials=20, clock="cpu_monotonic")

    def verdict(ref_ms: float, cand_ms: float, ci: tuple[float, float], flags: list[str]) -> EvalResult:
        return EvalResult(status=Status.OK, speedup=ref_ms / cand_ms, speedup_ci=ci, flags=flags,
                          reference=timing(ref_ms), candidate=timing(cand_ms))

    tiny = verdict(0.022, 0.033, (0.59, 0.72), ["cpu_timing"])
    assert not slower(tiny) and not faster(verdict(0.033, 0.011, (2.5, 3.5), ["cpu_timing"]))
    assert slower(verdict(0.022, 0.033, (0.59, 0.72), []))  # the GPU clock: slower
    apart = 0.022 + CPU_CALL_FLOOR_MS + 0.05
    assert slower(verdict(0.022, apart, (0.10, 0.20), ["cpu_timing"]))
    assert faster(verdict(apart, 0.022, (5.0, 9.0), ["cpu_timing"]))
    assert slower(EvalResult(status=Status.OK, speedup=0.5, speedup_ci=(0.4, 0.6), flags=["cpu_timing"]))  # no timings


def test_a_cpu_interval_reaches_up_by_the_protocols_cost_per_call():
    """On the CPU clock the candidate's calls may hold the handoff's fixed cost (stats.CPU_PROTOCOL_MS,
    at most half the call): the upper bound rises by what the speedup would be without it, the
    lower bound stays, and long calls barely move."""
    from cudal1.harness.parent.stats import CPU_PROTOCOL_MS, cpu_protocol_ci

    # an identical 20 us program as read on a quiet 2-core VM: 0.70x (0.66-0.75), calls 0.029 ms
    lo, hi = cpu_protocol_ci((0.66, 0.75), 0.029)
    assert lo == 0.66 and hi == pytest.approx(1.5) and lo <= 1.0 <= hi
    # 1 ms calls (0.076 ms measured): up by 1/(1 - 0.1)
    assert cpu_protocol_ci((0.90, 0.99), 1.0) == (0.90, pytest.approx(0.99 / (1 - CPU_PROTOCOL_MS)))
    # 70 ms calls: within 0.15%
    assert cpu_protocol_ci((0.98, 1.02), 70.0)[1] == pytest.approx(1.02, rel=2e-3)
    assert cpu_protocol_ci(None, 1.0) is None
