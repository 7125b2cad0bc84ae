"""harness.spec: the typed job a worker receives and the typed verdict it returns."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from cudal1.config import EvalConfig
from cudal1.harness.spec import TaskFindings, WorkerSpec, WorkerVerdict
from cudal1.tolerances import TOLERANCES


def _spec(**changes) -> WorkerSpec:
    base = dict(mode="eval", device="cpu", config=EvalConfig(), tolerances=TOLERANCES["exact"], input_seed=7,
                reference_path="r.py", reference_module="r", log_path="w.log")
    base.update(changes)
    return WorkerSpec(**base)


def test_spec_is_frozen_and_validates_its_mode():
    spec = _spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.mode = "build"  # type: ignore[misc]
    with pytest.raises(ValueError, match="mode"):
        _spec(mode="timing")


def test_fingerprint_sees_any_change_even_inside_the_config():
    a, b = _spec(), _spec(config=EvalConfig(correctness_trials=6))
    assert a.fingerprint() == _spec().fingerprint() and a.fingerprint() != b.fingerprint()
    spec = _spec(tolerances=copy.deepcopy(TOLERANCES["exact"]))  # a copy: the shared rules stay as they are
    before = spec.fingerprint()
    spec.tolerances.limits["float32"] = (1.0, 1.0)  # the dict inside is what a tamperer would reach for
    assert spec.fingerprint() != before
    assert TOLERANCES["exact"].limit("float32") == TOLERANCES["strict"].limit("float32") == (1e-4, 1e-4)


def test_verdict_from_message_by_stage():
    v = WorkerVerdict.from_message({
        "status": "ok", "flags": ["cpu_timing"], "phase": "done", "build_s": 1.5, "compile_log": "log",
        "correctness": {"trials": 3, "passed": 3, "rule": "exact"},
        "timing": {"ref": [[1.0, 1.0, 1.0, False, False]], "cand": [[0.5, 0.5, 0.5, False, False, 0.7]],
                   "clock": "cpu_monotonic", "unknown_timing_key": 2},
        "kernels": ["k"], "unknown_key": 1,
    })
    assert v.status == "ok" and v.build.build_s == 1.5 and v.build.compile_log == "log"
    assert v.timing is not None and v.timing.cand[0][0] == 0.5 and v.timing.clock == "cpu_monotonic"
    assert v.correctness["rule"] == "exact" and v.kernels == ["k"]


def test_verdict_without_timing_and_a_malformed_one():
    v = WorkerVerdict.from_message({"status": "compile_error", "build_error": True})
    assert v.timing is None and v.build.build_error and v.kernels is None
    with pytest.raises(KeyError):
        WorkerVerdict.from_message({"message": "no status"})


def test_task_findings():
    t = TaskFindings.from_message({"degenerate": None, "exact_digest": "abc", "exact_source": "computed"})
    assert t.degenerate is None and t.exact_digest == "abc" and t.exact_source == "computed"


def test_the_candidates_spec_carries_no_seed_and_no_tolerances(tmp_path):
    """A fixed ``--seed`` (the secret input seed) and the correctness rule stay on the clean side:
    the candidate's process gets only the settings it needs to run the calls it is handed."""
    from cudal1.harness.parent.evaluator import Evaluator
    from cudal1.harness.parent.plan import DevicePlan, Job
    from cudal1.harness.spec import CandidateSettings, CandidateSpec
    from cudal1.types import Candidate, Task

    names = {f.name for cls in (CandidateSpec, CandidateSettings) for f in dataclasses.fields(cls)}
    assert not {n for n in names if "seed" in n or "toleran" in n or n == "config"}, names
    config = EvalConfig(device="cpu", input_seed=987654321, cache_dir=str(tmp_path / "cache"))
    task = Task(name="t", source="import torch\nclass Model(torch.nn.Module):\n    pass\n")
    job = Job(task, Candidate("class ModelNew: pass\n", task_hash=task.hash))
    reference, candidate = Evaluator(config, DevicePlan("cpu", (None,), ""))._specs(job, tmp_path, "cpu", None, "eval")
    assert reference is not None and reference.input_seed == 987654321
    assert "987654321" not in candidate.fingerprint()
    assert candidate.settings == CandidateSettings.of(config)
