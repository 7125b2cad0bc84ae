"""CPU adversarial corpus, part 2: fixtures judged against a task of their own.

Every file in ``tests/fixtures/cpu_more`` starts with
    ``# expect: <status> [flag]``  (or several alternatives joined by ``|``, where the same
                                   cheat is legitimately caught at different points of the
                                   protocol depending on randomness the test cannot fix)
    ``# task: <task file, relative to the repository root>``
and optionally
    ``# xfail: <reason>``          a known judge bug: the expectation is the *correct* verdict,
                                   the test is marked xfail(strict=False) until the judge is fixed.
All fixtures are judged in one batch (one forkserver, one timing lane), like test_harness_cpu.

GPU fixtures (``tests/fixtures/gpu``) whose header has a ``# cpu-too`` line exercise a guard that
does not depend on the device; they are judged here as well, against their own task (their
``# task:`` line names a file in ``tests/fixtures/gpu``; default ``task_elementwise.py``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from test_harness_cpu import small_config

from cudal1.config import EvalConfig
from cudal1.harness import evaluate_pairs
from cudal1.tasks import load_task_file
from cudal1.types import Candidate, EvalResult, Status

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "cpu_more"
TIMEOUT_S = 15.0  # per-phase limit, as in test_harness_cpu

_EXPECT = re.compile(r"#\s*expect:\s*(.+?)\s*$")
_ALTERNATIVE = re.compile(r"^(\w+)(?:\s+(\w+))?$")
_TASK = re.compile(r"#\s*task:\s*(\S+)\s*$")
_XFAIL = re.compile(r"#\s*xfail:\s*(.+?)\s*$")


def _header(path: Path) -> tuple[list[tuple[str, str | None]], Path, str | None]:
    lines = path.read_text().splitlines()
    m = _EXPECT.match(lines[0]) if lines else None
    assert m, f"{path.name}: first line must be '# expect: <status> [flag] [| <status> [flag] ...]'"
    alternatives = []
    for alt in m.group(1).split("|"):
        a = _ALTERNATIVE.match(alt.strip())
        assert a, f"{path.name}: bad expectation {alt.strip()!r}"
        alternatives.append((a.group(1), a.group(2)))
    t = _TASK.match(lines[1]) if len(lines) > 1 else None
    assert t, f"{path.name}: second line must be '# task: <file>'"
    task = REPO / t.group(1)
    assert task.is_file(), f"{path.name}: task file {task} does not exist"
    x = _XFAIL.match(lines[2]) if len(lines) > 2 else None
    return alternatives, task, x.group(1) if x else None


GPU_FIXTURES = REPO / "tests" / "fixtures" / "gpu"


def _gpu_header(path: Path) -> tuple[list[tuple[str, str | None]], Path, str | None]:
    """A ``# cpu-too`` GPU fixture's expectation and task (see the module docstring)."""
    lines = path.read_text().splitlines()
    m = _EXPECT.match(lines[0])
    a = _ALTERNATIVE.match(m.group(1).strip()) if m else None
    assert a, f"{path.name}: first line must be '# expect: <status> [flag]'"
    task = next((_TASK.match(ln).group(1) for ln in lines[1:4] if _TASK.match(ln)), "task_elementwise.py")
    return [(a.group(1), a.group(2))], GPU_FIXTURES / task, None


def _cpu_too(path: Path) -> bool:
    return any(ln.strip() == "# cpu-too" for ln in path.read_text().splitlines()[:6])


FIXTURE_FILES = sorted(FIXTURES.glob("*.py")) + sorted(p for p in GPU_FIXTURES.glob("*.py") if _cpu_too(p))
HEADERS = {f.stem: (_header(f) if f.parent == FIXTURES else _gpu_header(f)) for f in FIXTURE_FILES}


def _params():
    for name, (_, _, xfail) in sorted(HEADERS.items()):
        marks = [pytest.mark.xfail(strict=False, reason=f"judge bug: {xfail}")] if xfail else []
        yield pytest.param(name, marks=marks, id=name)


def corpus_config(cache_dir: Path) -> EvalConfig:
    return small_config(cache_dir, timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict[str, EvalResult]:
    assert FIXTURE_FILES, f"no fixtures in {FIXTURES}"
    for alternatives, _, _ in HEADERS.values():
        for status, _ in alternatives:
            Status(status)  # a typo in an '# expect:' line fails here, loudly
    tasks = {path: load_task_file(path) for path in {task for _, task, _ in HEADERS.values()}}
    pairs = []
    for f in FIXTURE_FILES:
        task = tasks[HEADERS[f.stem][1]]
        pairs.append((task, Candidate(f.read_text(), task_hash=task.hash, label=f.stem)))
    results = evaluate_pairs(pairs, corpus_config(tmp_path_factory.mktemp("cache")))
    assert len(results) == len(pairs), "evaluate_pairs() must return one result per pair, in order"
    for (task, cand), res in zip(pairs, results):
        assert res.candidate_hash == cand.hash and res.task_hash == task.hash, "results are out of input order"
    return {f.stem: r for f, r in zip(FIXTURE_FILES, results)}


def _describe(r: EvalResult) -> str:
    return f"status={r.status.value} flags={r.flags} phase={r.phase} message={r.message[:400]!r}"


@pytest.mark.parametrize("name", list(_params()))
def test_corpus_verdict(batch, name):
    alternatives, _, _ = HEADERS[name]
    r = batch[name]
    matched = [(s, f) for s, f in alternatives if r.status.value == s and (f is None or f in r.flags)]
    assert matched, f"{name}: want one of {alternatives}; got {_describe(r)}"


def test_corpus_failures_have_no_speedup(batch):
    for name, r in batch.items():
        if r.status is not Status.OK:
            assert r.speedup is None and r.speedup_ci is None, name


def test_degenerate_task_flags_every_result(batch):
    for name, (_, task, _) in HEADERS.items():
        if task.name == "degenerate_mean.py":
            assert "degenerate_task" in batch[name].flags, f"{name}: {_describe(batch[name])}"


# The frame-walking cheats above are already stopped by the static guard.  With the static guard
# switched off, the worker's audit hook alone must still catch them (computed names, helper
# functions and signal-handler frames get past any AST check).
RUNTIME_ONLY = ["forge_signed_verdict", "frame_walk_tolerances", "forge_from_signal_handler", "loosen_via_inspect_stack"]


@pytest.fixture(scope="module")
def runtime_batch(tmp_path_factory) -> dict[str, EvalResult]:
    files = [FIXTURES / f"{name}.py" for name in RUNTIME_ONLY]
    task = load_task_file(HEADERS[RUNTIME_ONLY[0]][1])
    pairs = [(task, Candidate(f.read_text(), task_hash=task.hash, label=f.stem)) for f in files]
    config = small_config(tmp_path_factory.mktemp("cache"), timeout_s=TIMEOUT_S, static_guards="none")
    return {f.stem: r for f, r in zip(files, evaluate_pairs(pairs, config))}


@pytest.mark.parametrize("name", RUNTIME_ONLY)
def test_runtime_guard_alone_stops_frame_walkers(runtime_batch, name):
    r = runtime_batch[name]
    assert r.status is Status.REJECTED and "tampering" in r.flags, f"{name}: {_describe(r)}"
    if sys.version_info >= (3, 11) or name != "loosen_via_inspect_stack":  # sys._getframe is audited from 3.11
        assert "audit guard" in r.message, f"{name}: {_describe(r)}"
