"""harness.stats: bootstrap confidence intervals, speedup, and two-clock charging."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudal1.harness.stats import bootstrap_speedup_ci, speedup

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


class TestCharge:
    """stats.charge: two-clock samples -> charged times and the side-stream decision."""

    def _honest(self, n=50, stream=0.1, base=0.02, jitter=0.002):
        import random as _r

        rng = _r.Random(0)
        s = [stream + rng.uniform(-0.005, 0.005) for _ in range(n)]
        d = [x + base + rng.uniform(0, jitter) for x in s]
        return s, d

    def test_honest_candidate_is_not_side_stream(self):
        from cudal1.harness.stats import charge

        rs, rd = self._honest(stream=0.3)
        cs, cd = self._honest(stream=0.1)
        c = charge(rs, rd, cs, cd, [0.02] * 30)
        assert not c.side_stream
        assert abs(np.median(c.cand_ms) - np.median(cs)) < 0.005

    def test_escaped_work_is_charged_and_flagged(self):
        from cudal1.harness.stats import charge

        rs, rd = self._honest(stream=0.3)
        cs, cd = self._honest(stream=0.01)
        cd = [d + 0.25 for d in cd]  # 0.25 ms still running on another stream
        c = charge(rs, rd, cs, cd, [0.02] * 30)
        assert c.side_stream
        assert np.median(c.cand_ms) > 0.25

    def test_empty_calibration_uses_reference_excess(self):
        from cudal1.harness.stats import charge

        rs, rd = self._honest(stream=0.3, base=0.05)
        cs, cd = self._honest(stream=0.1, base=0.05)
        assert not charge(rs, rd, cs, cd, []).side_stream

    def test_cpu_clocks_agree(self):
        from cudal1.harness.stats import charge

        c = charge([1.0, 2.0], [1.0, 2.0], [0.5, 0.6], [0.5, 0.6], [])
        assert c.cand_ms == [0.5, 0.6] and not c.side_stream
