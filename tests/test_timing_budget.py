"""The timing budget holds the timed calls' whole wall (``reference.measure.fit_to_budget``): the
count planned from the calls' device time is cut, after the first round, to what the budget holds
at that round's own wall per call (masking, snapshots, inputs, re-checks, gate waits included),
with more rounds of smaller blocks and the same share of re-checked calls.  Unit tests, then one
verdict of the real CPU judge whose calls cost far more wall than its budget plans for."""

from __future__ import annotations

import random

import pytest

from cli_support import SMALL_DIAG
from cudal1.config import EvalConfig
from cudal1.harness.parent.stats import rounds
from cudal1.harness.reference.measure import fit_to_budget, recheck_count


def config(**kw) -> EvalConfig:
    return EvalConfig(device="cpu", **({"timing_budget_s": 2.0, "min_timing_trials": 10, "timing_trials": 50} | kw))


def first_round(ref_ms: float, cand_ms: float, size: int = 5) -> list[list]:
    return [["cand", size, cand_ms * size], ["ref", size, ref_ms * size]]


def test_calls_the_budget_holds_are_left_as_planned():
    recheck = {3, 17, 49}
    assert fit_to_budget(first_round(10.0, 10.0), 50, 5, recheck, {"ref": 5, "cand": 5}, config(), 0.1,
                         random.Random(0)) == (50, 5, recheck)  # 50 pairs x 20 ms = 1 s: inside 2 s


def test_calls_that_cost_more_wall_than_planned_are_cut_to_the_budget():
    rng = random.Random(1)
    recheck = {0, 3, 22, 31, 40, 49}
    n, size, kept = fit_to_budget(first_round(45.0, 35.0), 50, 5, recheck, {"ref": 5, "cand": 5}, config(), 0.1, rng)
    assert n == 25  # 2 s / 80 ms a pair
    assert size == 4  # the 20 calls left in five rounds
    assert {0, 3, 22} <= kept and 24 in kept and max(kept) == 24  # drawn below the count, and the new last call
    assert len(kept) >= recheck_count(25, 0.1) and {i for i in kept if i < 5} == {0, 3}  # the timed ones as drawn


def test_never_fewer_than_the_minimum():
    n, size, kept = fit_to_budget(first_round(400.0, 400.0), 50, 5, {49}, {"ref": 5, "cand": 5}, config(), 0.1,
                                  random.Random(2))
    assert (n, size) == (10, 1) and max(kept) == 9 and len(kept) == recheck_count(10, 0.1)


def test_no_cut_where_the_calls_left_cannot_hold_the_last_call_and_the_re_checks():
    """Blocks as large as the minimum (a config's choice): the calls already timed are the new
    count, whose last call was timed without its re-check; and a share of re-checks larger than
    the calls left.  Either way the count stays as planned."""
    args = (50, 12, {49}, {"ref": 12, "cand": 12}, config())
    assert fit_to_budget(first_round(400.0, 400.0, 12), *args, 0.1, random.Random(2)) == (50, 12, {49})
    assert fit_to_budget(first_round(400.0, 400.0), 50, 5, {49}, {"ref": 5, "cand": 5}, config(), 1.0,
                         random.Random(2)) == (50, 5, {49})  # 10 calls, all re-checked: only 5 are left


def test_the_rounds_still_pair_and_number_at_least_six():
    """Blocks of the first round's size, then of the smaller size: the parent's rounds() pairs
    them all, six rounds or more for the interval."""
    n, size, _ = fit_to_budget(first_round(45.0, 35.0), 50, 5, {49}, {"ref": 5, "cand": 5}, config(), 0.1,
                               random.Random(3))
    blocks = first_round(45.0, 35.0)
    done = 5
    while done < n:
        k = min(size, n - done)
        blocks += [["ref", k, 1.0], ["cand", k, 1.0]]
        done += k
    paired = rounds(blocks)
    assert len(paired) >= 6 and paired[-1] == ((n - min(size, n - 5), n), (n - min(size, n - 5), n))


@pytest.mark.cpu
def test_a_verdict_whose_calls_outrun_its_budget_times_fewer_of_them(cpu_judge_config, tmp_path):
    """Every timed output re-checked (``recheck_fraction`` 1.0: each call's wall holds a reference
    call and a comparison besides the two calls the plan counts): the count planned from the
    calls' time (at most 40) is cut after the first round, the verdict says so
    (``figures["cost"]["planned_trials"]``), and it still has its interval and re-checks every call."""
    from cudal1.harness import evaluate
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate, Status

    task = load_task_file(SMALL_DIAG)
    # the reference's own product (a faster one would take the stricter pass, which keeps its count)
    code = ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
            "    def forward(self, A, B):\n        return torch.diag(A) @ B\n")
    cfg = cpu_judge_config(tmp_path / "cache", timing_budget_s=0.4, timing_trials=40, min_timing_trials=8,
                           recheck_fraction=1.0)
    (r,) = evaluate(task, [Candidate(code, task_hash=task.hash, label="broadcast")], cfg)
    assert r.status is Status.OK, r.message
    planned = r.figures["cost"]["planned_trials"]  # the most, 40, unless a busy host's calls took longer
    assert 8 < planned <= 40
    assert 8 <= r.reference.trials == r.candidate.trials < planned
    assert r.speedup_ci is not None and r.correctness.rechecked == r.candidate.trials
