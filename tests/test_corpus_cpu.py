"""The GPU fixtures whose guard does not depend on the device (``# cpu-too`` in their header),
judged on the CPU against their own task, and the frame-walking cheats of ``tests/fixtures/cpu``
judged again with the static guard off (the candidate's audit hook alone must stop them).  The
CPU corpus itself is ``test_harness_cpu``'s; the header parser and the runner are
``tests/conftest.py``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cudal1.harness import evaluate_pairs
from cudal1.tasks import load_task_file
from cudal1.types import Candidate, EvalResult, Status

pytestmark = pytest.mark.cpu  # starts processes: the CPU tier (tests/tiers.py)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "cpu"
GPU_FIXTURES = REPO / "tests" / "fixtures" / "gpu"
TIMEOUT_S = 25.0  # per-phase limit, as in test_harness_cpu


CORPUS = sorted(p for p in GPU_FIXTURES.glob("*.py") if not p.name.startswith(("task_", "_")))
CORPUS_TASK = GPU_FIXTURES / "task_elementwise.py"  # for '# cpu-too' GPU fixtures without a '# task:' line


def CORPUS_SELECT(entry) -> bool:
    return entry.cpu_too


@pytest.fixture(scope="module")
def corpus_config(cpu_judge_config, tmp_path_factory):
    return cpu_judge_config(tmp_path_factory.mktemp("cache"), timeout_s=TIMEOUT_S)


def _describe(r: EvalResult) -> str:
    return f"status={r.status.value} flags={r.flags} phase={r.phase} message={r.message[:400]!r}"


def test_corpus_verdict(corpus, corpus_results, corpus_name, check_verdict):
    problem = check_verdict(corpus[corpus_name], corpus_results[corpus_name])
    assert not problem, problem


def test_corpus_failures_have_no_speedup(corpus_results):
    for name, r in corpus_results.items():
        if r.status is not Status.OK:
            assert r.speedup is None and r.speedup_ci is None, name


# The frame-walking cheats of tests/fixtures/cpu are already stopped by the static guard.  With the static guard
# switched off, the worker's audit hook alone must still catch them (computed names, helper
# functions and signal-handler frames get past any AST check).
RUNTIME_ONLY = [
    "forge_signed_verdict", "frame_walk_tolerances", "forge_from_signal_handler", "loosen_via_inspect_stack",
]


@pytest.fixture(scope="module")
def runtime_batch(cpu_judge_config, tmp_path_factory) -> dict[str, EvalResult]:
    from cli_support import SMALL_DIAG

    files = [FIXTURES / f"{name}.py" for name in RUNTIME_ONLY]
    task = load_task_file(SMALL_DIAG)
    pairs = [(task, Candidate(f.read_text(), task_hash=task.hash, label=f.stem)) for f in files]
    config = cpu_judge_config(tmp_path_factory.mktemp("cache"), timeout_s=TIMEOUT_S, static_guards="none")
    return {f.stem: r for f, r in zip(files, evaluate_pairs(pairs, config))}


@pytest.mark.parametrize("name", RUNTIME_ONLY)
def test_runtime_guard_alone_stops_frame_walkers(runtime_batch, name):
    r = runtime_batch[name]
    assert r.status is Status.REJECTED and "tampering" in r.flags, f"{name}: {_describe(r)}"
    if sys.version_info >= (3, 11) or name != "loosen_via_inspect_stack":  # sys._getframe is audited from 3.11
        assert "audit guard" in r.message, f"{name}: {_describe(r)}"
