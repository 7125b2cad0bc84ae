"""The timing budget on a GPU (``reference.measure.fit_to_budget``): a task of large tensors whose
kernel is quick but whose timed calls each carry the window's masking, snapshot and digest and a
fresh input of a gigabyte, so the count planned from the kernel's time alone would overrun the
budget several times over.  The verdict times fewer calls than planned, says so, stays ``ok`` with
its interval and re-checks, and its timing phase ends near the budget instead of far past it.
Writes ``$CUDAL1_GPU_TEST_OUT/timing_budget.json`` when set."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

BIG_TASK = '''
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0

def get_inputs():
    return [torch.randn(2**28)]  # 1 GiB of float32

def get_init_inputs():
    return []
'''


def test_calls_that_outrun_the_budget_are_cut_to_it(tmp_path):
    import torch

    from cudal1.config import EvalConfig
    from cudal1.harness import evaluate
    from cudal1.types import Candidate, Status, Task

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    task = Task(name="big_scale", source=BIG_TASK)
    cand = BIG_TASK.replace("class Model(", "class ModelNew(")
    budget = 0.5
    # no cap on the count: it is planned from the budget and the calls' own time alone
    cfg = EvalConfig(device="cuda", cache_dir=str(tmp_path / "cache"), correctness_trials=2, timing_budget_s=budget,
                     timing_trials=10_000, min_timing_trials=10)
    (r,) = evaluate(task, [Candidate(cand, task_hash=task.hash, label="same")], cfg)
    cost = r.figures.get("cost", {})
    seen = {"status": r.status.value, "message": r.message[:300], "trials": r.reference and r.reference.trials,
            "planned": cost.get("planned_trials"), "timing_s": r.phase_s.get("timing"), "speedup": r.speedup,
            "ci": r.speedup_ci, "rechecked": r.correctness.rechecked, "cost_ms": cost}
    out = os.environ.get("CUDAL1_GPU_TEST_OUT")
    if out:
        Path(out, "timing_budget.json").write_text(json.dumps(seen, indent=1, default=str))
    assert r.status is Status.OK, seen
    assert seen["planned"] and 10 <= seen["trials"] < seen["planned"], seen
    assert r.speedup_ci is not None and r.correctness.rechecked >= 2, seen
    # the calls fit the budget; what else the phase holds (calibration, warm-up, the seal, the last
    # probes) is outside it
    calls_s = sum(cost.get(k, 0.0) for k in ("ref_calls_ms", "cand_calls_ms", "inputs_ms", "recheck_ms",
                                             "held_ms")) / 1e3
    assert calls_s < 2.5 * budget, seen
