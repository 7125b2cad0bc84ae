"""CPU adversarial corpus, part 2: fixtures judged against a task of their own.

Every file in ``tests/fixtures/cpu_more`` starts with
    ``# expect: <status> [flag]``  (or several alternatives joined by ``|``, where the same
                                   cheat is legitimately caught at different points of the
                                   protocol depending on randomness the test cannot fix)
    ``# task: <task file, relative to the repository root>``
and optionally
    ``# xfail: <reason>``          a known judge bug: the expectation is the *correct* verdict,
                                   the test is marked xfail(strict=False) until the judge is fixed.
All fixtures are judged in one batch (one forkserver, one timing lane), like test_harness_cpu;
the header parser and the runner are ``tests/conftest.py``'s.

GPU fixtures (``tests/fixtures/gpu``) whose header has a ``# cpu-too`` line exercise a guard that
does not depend on the device; they are judged here as well, against their own task (their
``# task:`` line names a file in ``tests/fixtures/gpu``; default ``task_elementwise.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cudal1.harness import evaluate_pairs
from cudal1.tasks import load_task_file
from cudal1.types import Candidate, EvalResult, Status

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "cpu_more"
GPU_FIXTURES = REPO / "tests" / "fixtures" / "gpu"
TIMEOUT_S = 25.0  # per-phase limit, as in test_harness_cpu


CORPUS = sorted(FIXTURES.glob("*.py")) + sorted(p for p in GPU_FIXTURES.glob("*.py")
                                                if not p.name.startswith(("task_", "_")))
CORPUS_TASK = GPU_FIXTURES / "task_elementwise.py"  # for '# cpu-too' GPU fixtures without a '# task:' line


def CORPUS_SELECT(entry) -> bool:  # noqa: N802 - the name conftest looks for
    return entry.path.parent == FIXTURES or entry.cpu_too


@pytest.fixture(scope="module")
def corpus_config(cpu_judge_config, tmp_path_factory):
    return cpu_judge_config(tmp_path_factory.mktemp("cache"), timeout_s=TIMEOUT_S)


def _describe(r: EvalResult) -> str:
    return f"status={r.status.value} flags={r.flags} phase={r.phase} message={r.message[:400]!r}"


def test_cpu_more_fixtures_name_their_task(corpus):
    missing = [name for name, e in corpus.items() if e.path.parent == FIXTURES and e.task is None]
    assert not missing, f"fixtures in {FIXTURES} need a '# task:' line: {missing}"


def test_corpus_verdict(corpus, corpus_results, corpus_name, check_verdict):
    problem = check_verdict(corpus[corpus_name], corpus_results[corpus_name])
    assert not problem, problem


def test_corpus_failures_have_no_speedup(corpus_results):
    for name, r in corpus_results.items():
        if r.status is not Status.OK:
            assert r.speedup is None and r.speedup_ci is None, name


def test_degenerate_task_flags_every_result(corpus, corpus_results):
    degenerate = [name for name, e in corpus.items() if e.task is not None and e.task.name == "degenerate_mean.py"]
    assert degenerate
    for name in degenerate:
        assert "degenerate_task" in corpus_results[name].flags, f"{name}: {_describe(corpus_results[name])}"


# The frame-walking cheats above are already stopped by the static guard.  With the static guard
# switched off, the worker's audit hook alone must still catch them (computed names, helper
# functions and signal-handler frames get past any AST check).
RUNTIME_ONLY = ["forge_signed_verdict", "frame_walk_tolerances", "forge_from_signal_handler", "loosen_via_inspect_stack"]


@pytest.fixture(scope="module")
def runtime_batch(corpus, cpu_judge_config, tmp_path_factory) -> dict[str, EvalResult]:
    files = [FIXTURES / f"{name}.py" for name in RUNTIME_ONLY]
    task = load_task_file(corpus[RUNTIME_ONLY[0]].task)
    pairs = [(task, Candidate(f.read_text(), task_hash=task.hash, label=f.stem)) for f in files]
    config = cpu_judge_config(tmp_path_factory.mktemp("cache"), timeout_s=TIMEOUT_S, static_guards="none")
    return {f.stem: r for f, r in zip(files, evaluate_pairs(pairs, config))}


@pytest.mark.parametrize("name", RUNTIME_ONLY)
def test_runtime_guard_alone_stops_frame_walkers(runtime_batch, name):
    r = runtime_batch[name]
    assert r.status is Status.REJECTED and "tampering" in r.flags, f"{name}: {_describe(r)}"
    if sys.version_info >= (3, 11) or name != "loosen_via_inspect_stack":  # sys._getframe is audited from 3.11
        assert "audit guard" in r.message, f"{name}: {_describe(r)}"
