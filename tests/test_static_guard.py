"""harness.parent.static_guard: the hyperparameter and frames checks on source text."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_hyperparameter_guard_catches_ignored_constructor_arguments():
    from cudal1.harness.parent.static_guard import run_static_guards

    ref = (REPO / "examples" / "tasks" / "linear_relu.py").read_text()
    good = (REPO / "examples" / "candidates" / "linear_relu_addmm.py").read_text()
    assert not run_static_guards(good, reference=ref)
    ignored = good.replace("self.scale = scale", "self.scale = 0.5")
    (finding,) = run_static_guards(ignored, reference=ref)
    assert finding.flag == "hyperparameter_ignored" and finding.reject
    fewer = good.replace(
        "def __init__(self, in_features, out_features, scale):", "def __init__(self, in_features, out_features):"
    )
    fewer = fewer.replace("self.scale = scale", "self.scale = 0.5")
    assert [f.flag for f in run_static_guards(fewer, reference=ref)] == ["hyperparameter_ignored"]
    inherits = "from torch import nn\nclass ModelNew(Model):\n    pass\n"
    assert not run_static_guards(inherits, reference=ref)
    forwards = "class ModelNew(Model):\n    def __init__(self, *args):\n        super().__init__(*args)\n"
    assert not run_static_guards(forwards, reference=ref)


# ---------------------------------------------------------------------------------------------
# harness.parent.static_guard: the "frames" check


def test_frames_guard_flags_frame_and_closure_walking_only():
    from cudal1.harness.parent.static_guard import run_static_guards

    def flags_of(src):
        return [f.check for f in run_static_guards(src, ["frames"])]

    assert flags_of("import sys\ntry:\n    1/0\nexcept Exception as e:\n    f = e.__traceback__.tb_frame\n") == [
        "frames"
    ]
    assert flags_of("def g(f):\n    return getattr(f, 'f_back')\n") == ["frames"]
    assert flags_of("import ctypes\np = ctypes.pythonapi\n") == ["frames"]
    assert flags_of("import signal as s\ns.signal(s.SIGUSR1, print)\n") == ["frames"]
    assert flags_of("import sys\nx = sys._current_frames()\n") == ["frames"]
    assert flags_of("def f():\n    pass\nc = f.__closure__\n") == ["frames"]
    honest = (REPO / "tests" / "fixtures" / "cpu" / "honest_thread_queue_handoff.py").read_text()
    assert flags_of(honest) == []


def test_the_static_guards_run_once_per_job(monkeypatch):
    """One job reads its candidate's source once: the rejecting checks and the informational flags
    come from the same findings."""
    from cudal1.config import EvalConfig
    from cudal1.harness.parent import evaluator, static_guard
    from cudal1.harness.parent.plan import DevicePlan, Job
    from cudal1.harness.parent.sandbox import JobOutcome
    from cudal1.types import Candidate, EvalResult, Status, Task

    calls = []
    real = static_guard.run_static_guards
    monkeypatch.setattr(static_guard, "run_static_guards", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setattr(evaluator.Evaluator, "_run", lambda self, job, device, gpu, mode: JobOutcome())
    monkeypatch.setattr(evaluator, "assemble", lambda outcome, config, base: EvalResult(status=Status.OK))
    task = Task(
        name="t", source="import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    )
    fallback = (
        "import torch\ntry:\n    from torch.utils.cpp_extension import load_inline\n    ext = load_inline('e', '')\n"
        "except Exception:\n    ext = None\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        "
        "return x\n"
    )
    ev = evaluator.Evaluator(EvalConfig(device="cpu"), DevicePlan("cpu", (None,), ""))
    result = ev.evaluate_job(Job(task, Candidate(fallback, task_hash=task.hash)), None, None)
    assert len(calls) == 1 and "pytorch_fallback" in result.flags
