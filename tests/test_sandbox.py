"""harness.parent.sandbox.verdict_problem: the parent's re-checks of an "ok" verdict."""

from __future__ import annotations

from cudal1.config import EvalConfig
from cudal1.harness.spec import WorkerSpec
from cudal1.tolerances import TOLERANCES

STRICT = TOLERANCES["strict"]


def spec(mode: str = "eval", tolerances=STRICT, trials: int = 5) -> WorkerSpec:
    return WorkerSpec(mode=mode, device="cpu", config=EvalConfig(correctness_trials=trials), tolerances=tolerances,
                      input_seed=1, reference_path="ref.py", reference_module="ref", log_path="worker.log")


def _ok_verdict(**changes):
    data = {"status": "ok", "correctness": {"trials": 5, "passed": 5, "by_dtype": {"float32": [1e-5, 3.0]}},
            "timing": {"ref": [[1.0, 1.0, 0.1, False, False]] * 2, "cand": [[0.5, 0.5, 0.1, False, False, 0.9]] * 2}}
    data.update(changes)
    return data


class TestVerdictProblem:
    JOB = spec()
    PHASES = ["setup", "reference", "import", "construct", "correctness", "timing", "verify", "verify_timing"]

    def test_honest_verdict_holds(self):
        from cudal1.harness.parent.sandbox import verdict_problem

        assert verdict_problem(self.JOB, self.PHASES, _ok_verdict()) == ""
        assert verdict_problem(self.JOB, ["setup"], {"status": "incorrect"}) == ""  # only "ok" is re-checked
        assert verdict_problem(spec("build"), ["setup", "import"], {"status": "ok"}) == ""

    def test_missing_or_reordered_phases(self):
        from cudal1.harness.parent.sandbox import verdict_problem

        assert "phases" in verdict_problem(
            self.JOB, ["setup", "reference", "import", "construct", "correctness"], _ok_verdict()
        )
        assert "phases" in verdict_problem(
            self.JOB, ["setup", "reference", "import", "construct", "timing", "correctness"], _ok_verdict()
        )

    def test_too_few_trials_or_no_timing(self):
        from cudal1.harness.parent.sandbox import verdict_problem

        assert "correctness trials" in verdict_problem(
            self.JOB, self.PHASES, _ok_verdict(correctness={"trials": 2, "passed": 2})
        )
        assert "correctness trials" in verdict_problem(
            self.JOB, self.PHASES, _ok_verdict(correctness={"trials": 5, "passed": 4})
        )
        assert "timed calls" in verdict_problem(self.JOB, self.PHASES, _ok_verdict(timing={}))

    def test_errors_beyond_the_parents_tolerances(self):
        from cudal1.harness.parent.sandbox import verdict_problem

        # 1% off on values near 3: passes only with a loosened table in the worker
        loose = _ok_verdict(correctness={"trials": 5, "passed": 5, "by_dtype": {"float32": [0.03, 3.0]}})
        assert "exceeds the judge's tolerance" in verdict_problem(self.JOB, self.PHASES, loose)
        # exactly at the bound of the elementwise test is fine
        edge = _ok_verdict(correctness={"trials": 5, "passed": 5, "by_dtype": {"float32": [1e-4 + 1e-4 * 3.0, 3.0]}})
        assert verdict_problem(self.JOB, self.PHASES, edge) == ""
