"""types: the EvalResult contract, its summary and its JSON round trip."""

from __future__ import annotations

import json

import pytest

from cudal1.types import Correctness, Environment, EvalResult, Status, Timing

CONTRACT_KEYS = {"status", "correct", "speedup", "reference_ms", "candidate_ms", "flags", "message"}


def _full_result() -> EvalResult:
    return EvalResult(
        status=Status.OK,
        task_name="diag_matmul",
        task_hash="t" * 64,
        candidate_hash="c" * 64,
        message="",
        flags=["cpu_timing"],
        correctness=Correctness(trials=5, passed=5, max_abs_error=0.0, max_rel_error=0.0, rechecked=2),
        reference=Timing.from_samples([2.0, 2.2, 2.1, 1.9], "cpu_monotonic"),
        candidate=Timing.from_samples([1.0, 1.1, 0.9], "cpu_monotonic"),
        speedup=2.0,
        speedup_ci=(1.8, 2.3),
        phase="done",
        environment=Environment(device="cpu", torch="2.x", python="3.11"),
        config_hash="abc",
        wall_s=1.5,
        build_s=0.1,
    )


class TestTypes:
    def test_summary_contract(self):
        s = _full_result().summary()
        assert CONTRACT_KEYS <= set(s)
        assert s["status"] == "ok" and s["correct"] is True
        assert s["speedup"] == 2.0
        assert s["reference_ms"] == pytest.approx(2.05)
        assert s["candidate_ms"] == pytest.approx(1.0)
        assert s["flags"] == ["cpu_timing"]
        assert s["speedup_ci"] == [1.8, 2.3]
        json.dumps(s)

    def test_summary_of_failure(self):
        r = EvalResult(status=Status.INCORRECT, message="bad", flags=["value_mismatch"])
        s = r.summary()
        assert CONTRACT_KEYS <= set(s)
        assert s["correct"] is False
        assert s["speedup"] is None and s["reference_ms"] is None and s["candidate_ms"] is None
        assert s["status"] == "incorrect" and s["message"] == "bad"

    def test_only_ok_is_correct(self):
        for status in Status:
            assert EvalResult(status=status).correct is (status is Status.OK)

    def test_round_trip(self):
        r = _full_result()
        assert EvalResult.from_dict(r.to_dict()) == r

    def test_round_trip_through_json(self):
        r = _full_result()
        back = EvalResult.from_dict(json.loads(json.dumps(r.to_dict())))
        assert back == r
        assert isinstance(back.status, Status)
        assert isinstance(back.speedup_ci, tuple)
        assert isinstance(back.reference, Timing)

    def test_round_trip_minimal(self):
        r = EvalResult(status=Status.TIMEOUT, message="killed")
        assert EvalResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r

    def test_to_dict_status_is_a_string(self):
        assert _full_result().to_dict()["status"] == "ok"

    def test_timing_from_samples(self):
        t = Timing.from_samples([3.0, 1.0, 2.0], "cuda_event", keep=False)
        assert t.median_ms == 2.0 and t.min_ms == 1.0 and t.trials == 3
        assert t.samples_ms == []
        single = Timing.from_samples([5.0], "cpu_monotonic")
        assert single.iqr_ms == 0.0 and single.median_ms == 5.0
