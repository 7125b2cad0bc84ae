"""Unit tier: cudal1.report.aggregate against hand-computed values."""

from __future__ import annotations

import math

import pytest

from cudal1.report.aggregate import (
    CONVENTIONS,
    Conventions,
    TaskOutcome,
    aggregate,
    conventions,
    describe,
    fast_p,
    fast_p_key,
    geomean,
    percentile,
    summarize,
    verdict_counts,
)
from cudal1.types import Status


def test_geomean_skips_missing_and_non_positive():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([1.0, None, 0.0, -3.0, 4.0]) == pytest.approx(2.0)
    assert geomean([]) is None and geomean([None, 0.0]) is None


def test_percentile_interpolates_linearly():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(1.75)  # position 0.75
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.75) == pytest.approx(3.25)  # unsorted input
    assert percentile([5.0], 0.25) == 5.0
    assert percentile([], 0.5) is None
    assert percentile([1.0, 3.0], 0.5) == pytest.approx(2.0)


def test_fast_p_kernelbench_definition():
    bests = [2.0, None, 1.0, 1.5, 0.5]
    assert fast_p(bests, 0.0) == pytest.approx(4 / 5)  # fast_0: correct, any speed
    assert fast_p(bests, 1.0) == pytest.approx(2 / 5)  # strictly faster: 1.0 does not count
    assert fast_p(bests, 1.5) == pytest.approx(1 / 5)  # 1.5 is not > 1.5
    assert fast_p(bests, 2.0) == 0.0
    assert fast_p([], 1.0) is None
    assert fast_p([None, None], 0.0) == 0.0
    assert [fast_p_key(p) for p in (0, 1.0, 1.2, 1.5, 2.0)] == ["0", "1.0", "1.2", "1.5", "2.0"]


def test_conventions_all_tasks_measured_and_cuda_l1():
    every, measured, cl1 = conventions("all-tasks"), conventions("measured"), conventions("cuda-l1")
    assert every.value(None) == 1.0 and every.value(0.7) == 0.7 and every.value(1.005) == 1.005
    assert measured.value(None) is None and measured.value(0.7) == 0.7
    assert cl1.value(None) == 1.0 and cl1.value(0.7) == 1.0
    assert cl1.value(1.01) == 1.0 and cl1.value(1.0101) == 1.0101  # needs more than 1.01x
    with pytest.raises(KeyError, match="known: all-tasks, measured, cuda-l1"):
        conventions("nope")
    assert Conventions("x", missing=None, threshold=1.2).value(1.1) is None


def test_summarize_by_hand():
    bests = [2.0, None, 1.005, 1.5]
    s = summarize(bests, CONVENTIONS["measured"])
    assert (s["tasks"], s["ok"], s["n"]) == (4, 3, 3)
    assert s["mean"] == pytest.approx((2.0 + 1.005 + 1.5) / 3)
    assert s["median"] == pytest.approx(1.5)
    assert s["geomean"] == pytest.approx((2.0 * 1.005 * 1.5) ** (1 / 3))
    assert s["max"] == 2.0
    assert s["p25"] == pytest.approx(1.2525) and s["p75"] == pytest.approx(1.75)
    assert s["fast_p"] == pytest.approx({"0": 0.75, "1.0": 0.75, "1.2": 0.5, "1.5": 0.25, "2.0": 0.0})
    assert s["faster"] == 3
    c = summarize(bests, CONVENTIONS["cuda-l1"])  # missing and 1.005 count 1.0
    assert c["n"] == 4 and c["mean"] == pytest.approx(5.5 / 4)
    assert c["geomean"] == pytest.approx(3.0 ** 0.25) and c["median"] == pytest.approx(1.25)
    assert c["fast_p"] == s["fast_p"]  # fast_p does not depend on the convention
    assert c["faster"] == 2  # 1.005 is not a speedup under CUDA-L1's rule
    a = summarize(bests)  # the default: every task, the unsolved one at 1.0
    assert (
        a["n"] == 4
        and a["geomean"] == pytest.approx((2.0 * 1.005 * 1.5) ** 0.25)
        and a["median"] == pytest.approx(1.2525)
    )


def test_solving_fewer_tasks_cannot_raise_the_default_figures():
    broad, narrow = [4.0, 1.5, 1.2, 1.1], [4.0, None, None, None]
    assert summarize(broad)["geomean"] > summarize(narrow)["geomean"]
    assert summarize(broad)["median"] > summarize(narrow)["median"]
    solved_only = CONVENTIONS["measured"]  # the figure a narrow model inflates: shown beside, labelled
    assert summarize(narrow, solved_only)["geomean"] > summarize(broad, solved_only)["geomean"]


def test_summarize_empty_and_none_only():
    s = summarize([])
    assert s["tasks"] == 0 and s["mean"] is None and s["fast_p"]["1.0"] is None
    s = summarize([None, None], CONVENTIONS["measured"])
    assert s["ok"] == 0 and s["geomean"] is None and s["fast_p"]["0"] == 0.0
    assert summarize([None, None])["geomean"] == 1.0
    assert summarize([None], CONVENTIONS["cuda-l1"])["geomean"] == 1.0
    assert describe([3.0]) == {
        "mean": 3.0, "median": 3.0, "geomean": pytest.approx(3.0), "max": 3.0, "p25": 3.0, "p75": 3.0,
    }


def test_aggregate_levels_baselines_and_degenerate_apart():
    outs = [TaskOutcome("level1/1", 1, 2.0, baselines={"compile": 1.6}),
            TaskOutcome("level1/2", 1, None),
            TaskOutcome("level2/1", 2, 1.005, baselines={"compile": 0.9}),
            TaskOutcome("level2/2", 2, 50.0, degenerate=True, baselines={"compile": 2.0}),
            TaskOutcome("mine", None, 1.5)]
    agg = aggregate(outs)
    assert agg["summary"]["tasks"] == 4 and agg["summary"]["degenerate"] == 1
    assert agg["summary"]["max"] == 2.0  # the degenerate 50x is not in any figure
    assert agg["degenerate"] == ["level2/2"]
    assert list(agg["levels"]) == ["level1", "level2", "other"]
    assert agg["levels"]["level1"]["tasks"] == 2 and agg["levels"]["level1"]["geomean"] == pytest.approx(
        2.0**0.5
    )  # 1/2 at 1.0
    assert aggregate(outs, CONVENTIONS["measured"])["levels"]["level1"]["geomean"] == pytest.approx(2.0)  # solved only
    assert agg["levels"]["level2"]["tasks"] == 1 and agg["levels"]["level2"]["fast_p"]["1.0"] == 1.0
    comp = agg["baselines"]["compile"]
    assert comp["tasks"] == 2  # only where the baseline was measured, degenerate left out
    assert comp["geomean"] == pytest.approx(math.sqrt((2.0 / 1.6) * (1.005 / 0.9)))
    assert comp["fast_p"]["1.2"] == pytest.approx(0.5)  # 1.25 > 1.2; 1.1167 is not
    assert comp["baseline_over_eager"]["geomean"] == pytest.approx(math.sqrt(1.6 * 0.9))


def test_verdict_counts():
    class R:
        def __init__(self, status, flags):
            self.status, self.flags = status, flags

    got = verdict_counts([R(Status.OK, ["cpu_timing"]), R("rejected", ["side_stream", "cpu_timing"]), R(Status.OK, [])])
    assert got == {"statuses": {"ok": 2, "rejected": 1}, "flags": {"cpu_timing": 2, "side_stream": 1}}
