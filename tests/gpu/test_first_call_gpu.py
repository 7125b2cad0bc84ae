"""The candidate's first call on a GPU (``EvalConfig.first_call_lease``): under ``choosers`` it
holds the lease exclusive only while a choice is made by timing, under ``exclusive`` the whole call;
and a torch.compile baseline's under ``EvalConfig.baseline_lease`` (3, below).

1. On this torch: the choosers' setters (cuDNN's benchmark mode, TunableOp's enable and tuning)
   and Inductor's run-time autotuners (:data:`cudal1.harness.child.compiling.AUTOTUNE_STEPS`) are
   all found, and turning TunableOp's tuning on inside a watched request opens the bracket.
2. Through the judge, two workers sharing the GPU, a small convolution: a plain candidate's job
   holds the exclusive lease before timing for next to nothing under ``choosers`` and for its first
   call under ``exclusive``; a candidate that turns cuDNN's benchmark mode on inside its forward
   (as the builtin's cudnn-autotune pass does) holds it from there to the call's end; a
   torch.compile'd candidate's Inductor autotuning holds it too; every verdict ``ok``
   (``figures["exclusive_before_timing_s"]``); and the cuDNN-autotuned candidate reads within 10%
   of its figure under ``exclusive`` (cuDNN's choice made beside other workers' GPU work moved
   such a figure 15-25%: 0.849x against 1.000x, 0.753x against 1.001x; H200, 2026-12-04/05).
3. Two max-autotune baselines side by side (a GEMM and a convolution): under ``baseline_lease:
   choosers`` the two hold the exclusive lease before timing for less in all than under
   ``exclusive``, each for more than nothing, and each reads within 5% of its exclusive figure.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

CONV_TASK = '''
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(32, 64, 3, padding=1)

    def forward(self, x):
        return self.conv(x)

def get_inputs():
    return [torch.randn(16, 32, 64, 64)]

def get_init_inputs():
    return []
'''

PLAIN = CONV_TASK.replace("class Model(", "class ModelNew(")
CUDNN_AUTOTUNE = CONV_TASK.replace("class Model(", "class ModelNew(").replace(
    "        return self.conv(x)",
    "        cudnn = torch.backends.cudnn\n"
    "        with cudnn.flags(enabled=cudnn.enabled, benchmark=True, deterministic=cudnn.deterministic,\n"
    "                         allow_tf32=cudnn.allow_tf32):\n"
    "            return self.conv(x)")
COMPILED = CONV_TASK.replace("class Model(", "class ModelNew(").replace(
    "        self.conv = torch.nn.Conv2d(32, 64, 3, padding=1)",
    "        self.conv = torch.nn.Conv2d(32, 64, 3, padding=1)\n"
    "        self.run = torch.compile(lambda x: torch.relu(self.conv(x)), "
    "options={'coordinate_descent_tuning': True})").replace(
    "        return self.conv(x)", "        return self.run(x)")
COMPILED_TASK = CONV_TASK.replace("        return self.conv(x)", "        return torch.relu(self.conv(x))")


def test_the_choosers_setters_and_inductors_run_time_autotuners_are_found_on_this_torch(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from cudal1.harness.child import choosers, compiling

    for name in choosers.SETTERS:  # restored after the test
        monkeypatch.setattr(torch._C, name, getattr(torch._C, name))
    prop = type(sys.modules["torch.backends.cudnn"]).__dict__["benchmark"]
    monkeypatch.setattr(prop, "setter", prop.setter)
    missing = [f"{m}:{p}" for m, p in compiling.AUTOTUNE_STEPS if compiling._attribute(m, p) is None]
    assert not missing, missing
    events: list[bool] = []
    watch = choosers.Watch(events.append)
    assert watch.install() == list(choosers.SETTERS)
    enabled, tuning = torch.cuda.tunable.is_enabled(), torch.cuda.tunable.tuning_is_enabled()
    try:
        torch.cuda.tunable.enable(True)
        torch.cuda.tunable.tuning_enable(False)
        with watch.request(True):
            assert events == []
            torch.cuda.tunable.tuning_enable(True)
            assert "tunableop" in choosers.active() and events == [True]
        assert events == [True, False]
    finally:
        torch.cuda.tunable.tuning_enable(tuning)
        torch.cuda.tunable.enable(enabled)
    with watch.request(True):
        with torch.backends.cudnn.flags(enabled=True, benchmark=True):
            assert events == [True, False, True]
    assert events == [True, False, True, False]


def test_only_a_first_call_that_chooses_by_timing_holds_the_lease_exclusive(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from cudal1.config import EvalConfig
    from cudal1.harness import evaluate_pairs
    from cudal1.types import Candidate, Status, Task

    task, compiled_task = Task(name="conv", source=CONV_TASK), Task(name="conv_relu", source=COMPILED_TASK)
    cases = {"plain": (task, PLAIN), "cudnn_autotune": (task, CUDNN_AUTOTUNE),
             "compiled_coordesc": (compiled_task, COMPILED)}
    summary: dict[str, dict] = {}
    for lease in ("choosers", "exclusive"):
        config = EvalConfig(device="cuda", cache_dir=str(tmp_path / lease), workers_per_gpu=2, compile_off_lease=True,
                            first_call_lease=lease, correctness_trials=3, timing_budget_s=0.3, timing_trials=20,
                            min_timing_trials=5)
        pairs = [(t, Candidate(src + f"\n# {lease}\n", task_hash=t.hash, label=name))
                 for name, (t, src) in cases.items()]
        for (_, c), r in zip(pairs, evaluate_pairs(pairs, config)):
            summary[f"{lease}:{c.label}"] = {"status": r.status.value, "message": r.message[:300],
                                             "exclusive_s": r.figures.get("exclusive_before_timing_s"),
                                             "first_call_ms": r.figures.get("correctness_cost", {}).get(
                                                 "candidate_first_ms"), "speedup": r.speedup}
    out_dir = os.environ.get("CUDAL1_GPU_TEST_OUT")
    if out_dir:
        Path(out_dir, "first_call_lease.json").write_text(json.dumps(summary, indent=1))
    assert all(v["status"] == Status.OK.value for v in summary.values()), json.dumps(summary, indent=1)
    ex = {k: v["exclusive_s"] for k, v in summary.items()}
    assert all(isinstance(x, float) for x in ex.values()), ex
    assert ex["choosers:plain"] == 0.0, ex  # nothing chosen by timing: the phase's shared lease throughout
    assert ex["exclusive:plain"] > 0.0, ex  # the whole first call
    assert ex["choosers:cudnn_autotune"] > 0.001, ex  # cuDNN's benchmark mode, turned on inside the call
    assert ex["choosers:compiled_coordesc"] > 0.001, ex  # the compile's GPU steps and coordinate descent
    chosen, whole = summary["choosers:cudnn_autotune"]["speedup"], summary["exclusive:cudnn_autotune"]["speedup"]
    assert chosen >= 0.9 * whole, json.dumps(summary, indent=1)  # its choice made alone under both rules


GEMM_TASK = '''
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(1024, 1024)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0

def get_inputs():
    return [torch.randn(2048, 1024)]

def get_init_inputs():
    return []
'''


def test_a_compiled_baselines_first_call_under_choosers_holds_the_lease_only_for_its_choices(tmp_path):
    """``EvalConfig.baseline_lease``: a max-autotune baseline (its GEMM's template choice and its
    kernels' configs are chosen by timing) beside another worker's baseline.  Under ``choosers``
    the two hold the exclusive lease before timing for less time in all than under ``exclusive``,
    each for more than nothing (its choices are still made alone), and each figure stays within 5% of the
    exclusive one (choices made beside other workers moved baseline figures 6-21%, 2026-12-03)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from cudal1.config import EvalConfig
    from cudal1.harness import measure_baselines
    from cudal1.types import Status, Task

    tasks = [Task(name="gemm_relu", source=GEMM_TASK), Task(name="conv_relu", source=COMPILED_TASK)]
    modes = ["compile-max-autotune-no-cudagraphs"]
    summary: dict[str, dict] = {}
    for lease in ("exclusive", "choosers"):
        config = EvalConfig(device="cuda", cache_dir=str(tmp_path / lease), workers_per_gpu=2, compile_off_lease=True,
                            baseline_lease=lease, baseline_cache=False, correctness_trials=3, timing_budget_s=0.5,
                            timing_trials=30, min_timing_trials=5)
        for (task_hash, _), r in measure_baselines(tasks, modes, config).items():
            name = next(t.name for t in tasks if t.hash == task_hash)
            summary[f"{lease}:{name}"] = {"status": r.status.value, "message": r.message[:300], "speedup": r.speedup,
                                          "ci": r.speedup_ci, "phase_s": r.phase_s,
                                          "exclusive_s": r.figures.get("exclusive_before_timing_s")}
    out_dir = os.environ.get("CUDAL1_GPU_TEST_OUT")
    if out_dir:
        Path(out_dir, "baseline_lease.json").write_text(json.dumps(summary, indent=1))
    assert all(v["status"] == Status.OK.value for v in summary.values()), json.dumps(summary, indent=1)
    for task in tasks:
        held, shared = summary[f"exclusive:{task.name}"], summary[f"choosers:{task.name}"]
        # a first call made almost wholly of choices holds about as long under both (the conv:
        # 6.87 s against 6.85 s, H200, 2026-12-05); the other tasks' shared phases make the sum less
        assert 0.0 < shared["exclusive_s"] < 1.1 * held["exclusive_s"], json.dumps(summary, indent=1)
        assert abs(shared["speedup"] / held["speedup"] - 1) < 0.05, json.dumps(summary, indent=1)
    total = {rule: sum(summary[f"{rule}:{t.name}"]["exclusive_s"] for t in tasks) for rule in ("exclusive", "choosers")}
    assert total["choosers"] < total["exclusive"], json.dumps(summary, indent=1)
