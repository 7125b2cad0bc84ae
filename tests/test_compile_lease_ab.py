"""benchmarks/compile_lease_ab.py: one arm through the real subprocess harness on the CPU (the
compiled candidate compiles, the eager one is timed), the two-arm comparison, and a bad argument."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import SMALL_DIAG  # the bundled task at an eighth of its work

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "compile_lease_ab.py"


@pytest.mark.cpu
def test_an_arm_judges_a_compiled_and_an_eager_candidate_per_task_with_its_baselines_along(tmp_path):
    """One arm (``choices-first``: released with the lease's order) at two workers, the task's
    compile-default baseline in the candidates' batch (``--along``), each baseline's lease waits kept."""
    out = tmp_path / "ab.json"
    done = subprocess.run([sys.executable, str(SCRIPT), str(SMALL_DIAG),
                           "--device", "cpu", "--arms", "choices-first", "--workers-per-gpu", "2",
                           "--baseline-modes", "compile-default", "--along",
                           "--timing-budget", "0.3", "--timing-trials", "10", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (arm,) = json.loads(out.read_text())
    assert arm["arm"] == "choices-first" and arm["n"] == 3 and arm["ok"] == 3, json.dumps(arm, indent=1)[-3000:]
    compiled = arm["jobs"]["diag_matmul:compiled"]
    assert compiled["phase_s"].get("compile", 0) > 0  # on the CPU the lease is never given back
    assert arm["jobs"]["diag_matmul:baseline compile-default"]["speedup"] > 0
    assert set(arm["baseline_lane_s"]) == {"diag_matmul:baseline compile-default"}
    assert "diag_matmul:baseline compile-default waited" in done.stdout


def test_two_arms_compare_job_by_job():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import compile_lease_ab

    job = lambda s, ci: {"status": "ok", "speedup": s, "ci": ci, "phase_s": {}, "message": ""}  # noqa: E731
    first = {"arm": "released", "wall_s": 80.0, "n": 2, "ok": 2, "compile_held_s": 0.0, "compile_cpu_s": 40.0,
             "lane_s": 5.0, "jobs": {"t:compiled": job(1.50, [1.49, 1.51]), "t:eager": job(1.00, [0.99, 1.01])}}
    second = {**first, "arm": "held", "wall_s": 120.0, "compile_held_s": 40.0, "compile_cpu_s": 0.0,
              "jobs": {"t:compiled": job(1.60, [1.59, 1.61]), "t:eager": job(1.001, [0.995, 1.005])}}
    text = "\n".join(compile_lease_ab.compare([first, second]))
    assert "t:compiled: released 1.500  held 1.600  (intervals apart)" in text
    assert "overlapping 95% intervals: 1 of 2; within 1%: 1 of 2" in text and "released 80 against held 120" in text
    assert text.splitlines()[1].endswith("  0.0")  # an arm from before the exclusive seconds were kept


@pytest.mark.cpu
def test_a_bad_arm_is_a_one_line_error():
    done = subprocess.run([sys.executable, str(SCRIPT), "kernelbench:level1/1", "--arms", "sideways"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and ("--arms takes held, released, autotune-held, first-call-exclusive, "
                                     "baseline-choosers, choices-first") in done.stderr


def test_the_baseline_arm_is_released_with_the_candidates_rule_for_compiled_baselines():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import compile_lease_ab
    from cudal1.config import EvalConfig

    arm = EvalConfig(**compile_lease_ab.ARM_SETTINGS["baseline-choosers"])
    assert arm.baseline_lease == "choosers" and arm.compile_off_lease and arm.first_call_lease == "choosers"
    assert EvalConfig(**compile_lease_ab.ARM_SETTINGS["released"]).baseline_lease == "exclusive"
    order = EvalConfig(**compile_lease_ab.ARM_SETTINGS["choices-first"])
    assert order.lease_order == "choices-first" and order.compile_off_lease and order.baseline_lease == "exclusive"
