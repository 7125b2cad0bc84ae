"""GPU tests of the judge: verdicts on the GPU fixtures, baselines, and the build cache.

What is covered: ``load_inline`` (module-level builds through the CPU pre-build), Triton, CUDA-graph,
joined-side-stream, reused-buffer and pre-transposed-matmul candidates that must pass; side-stream
(unjoined, partly escaped, wrong-stream event wait, thread-launched), freed-memory, stale-CUDA-graph
(call count, data_ptr keys), result-cache, TF32/fp16 precision and synchronize-tampering cheats that
must be caught; an illegal memory access and a CUDA compile error that must become verdicts; the
timer charging side-stream work; eager / ``torch.compile`` / CUDA-graph baselines on KernelBench
tasks; a cached rebuild.  Not covered: multi-GPU lanes, timing accuracy against an external profiler.

Fixture files (``tests/fixtures/gpu/*.py`` not starting with ``task_``/``_``) start with
``# expect: <status> [flag]``; further header comment lines may hold ``# task: <task_*.py in the
same folder>`` (default ``task_elementwise.py``) and ``# xfail: <reason>`` (a known escape or judge
bug: the expectation is the *correct* verdict, the test is xfail(strict=False) until it is fixed).
The header parser and the batch runner are ``tests/conftest.py``'s (shared with the CPU corpora).

Every test is marked ``gpu``; ``tests/conftest.py`` skips them where torch sees no CUDA GPU.  Run
on a CUDA machine from the repository root::

    python -m pytest tests/gpu -q

``CUDAL1_KERNELBENCH`` names KernelBench's JSONL (default ``<repo>/../shared/kernelbench/
kernelbench.jsonl``; the baseline test is skipped when neither exists).  With
``CUDAL1_GPU_TEST_OUT=DIR`` every result is also written to ``DIR/*.json`` for inspection.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from cudal1.config import EvalConfig
from cudal1.tasks import load_task_file, load_tasks
from cudal1.types import Candidate, EvalResult, Status
from proc_support import left_running

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "gpu"
TASK_FILE = FIXTURES / "task_elementwise.py"
KERNELBENCH_DEFAULT = REPO.parent / "shared" / "kernelbench" / "kernelbench.jsonl"
BASELINE_SELECTOR = "kernelbench:level1/19,23,40"
BASELINE_MODES = ["eager", "compile-default", "cudagraph"]  # cudal1.compile_modes names


# ---- helpers ------------------------------------------------------------------------------------

def candidate_files() -> list[Path]:
    return sorted(p for p in FIXTURES.glob("*.py") if not p.name.startswith(("task_", "_")))


def uses_triton(path: Path) -> bool:
    return re.search(r"^\s*(import|from)\s+triton\b", path.read_text(), re.M) is not None


def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def describe(r: EvalResult) -> str:
    """Everything useful when an assertion fails on a machine we cannot log into."""
    parts = [
        f"status={r.status.value} flags={r.flags} phase={r.phase} speedup={r.speedup}",
        f"ref_ms={r.reference_ms} cand_ms={r.candidate_ms} wall_s={r.wall_s:.1f} build_s={r.build_s:.2f}",
        f"correctness={r.correctness}",
        f"environment={r.environment}",
        f"message: {r.message[-3000:]}",
    ]
    if r.stderr_tail.strip():
        parts.append(f"worker log tail: {r.stderr_tail[-3000:]}")
    if r.compile_log.strip():
        parts.append(f"compile log tail: {r.compile_log[-3000:]}")
    return "\n".join(parts)


def dump(name: str, results: dict[str, EvalResult]) -> None:
    out = os.environ.get("CUDAL1_GPU_TEST_OUT")
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    data = {key: r.to_dict() for key, r in results.items()}
    Path(out, f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def gpu_config(cache_dir: Path, **changes) -> EvalConfig:
    return EvalConfig(device="cuda", build_timeout_s=600.0, cache_dir=str(cache_dir)).replace(**changes)


def kernelbench_source() -> Path | None:
    env = os.environ.get("CUDAL1_KERNELBENCH")
    if env:
        if not Path(env).exists():
            pytest.fail(f"CUDAL1_KERNELBENCH={env} does not exist")
        return Path(env)
    return KERNELBENCH_DEFAULT if KERNELBENCH_DEFAULT.exists() else None


# ---- the fixture batch --------------------------------------------------------------------------

CORPUS = candidate_files()
CORPUS_TASK = TASK_FILE


@pytest.fixture(scope="module")
def batch_config(tmp_path_factory) -> EvalConfig:
    """One fresh build cache for the module: the batch fills it, the cached-rebuild test reuses it."""
    return gpu_config(tmp_path_factory.mktemp("cudal1_cache"))


@pytest.fixture(scope="module")
def corpus_config(batch_config) -> EvalConfig:
    return batch_config


@pytest.fixture(scope="module")
def fixture_results(corpus_results) -> dict[str, EvalResult]:
    """All GPU fixtures judged in one batch (builds overlap timing), each against its own task
    (``# task:``), keyed by file stem."""
    dump("fixtures", corpus_results)
    return corpus_results


@pytest.mark.gpu
def test_fixture_files_are_well_formed(corpus):
    assert TASK_FILE.is_file()
    assert len(corpus) >= 8
    for name, entry in corpus.items():
        assert len(entry.expect) == 1, f"{name}: one expectation per GPU fixture"
        if entry.task is not None:
            assert entry.task.parent == FIXTURES and entry.task.name.startswith("task_"), \
                f"{name}: '# task:' must name a task_*.py file in {FIXTURES}"


@pytest.mark.gpu
def test_fixture_verdict(corpus, fixture_results, corpus_name, check_verdict):
    entry = corpus[corpus_name]
    if uses_triton(entry.path) and not has_triton():
        pytest.skip("needs Triton")
    r = fixture_results[corpus_name]
    problem = check_verdict(entry, r)
    assert not problem, problem + "\n" + describe(r)
    if r.status is not Status.COMPILE_ERROR:  # a build failure is judged by the CPU pre-build alone
        assert r.environment.gpu_name, describe(r)
    if r.status is Status.OK:
        assert r.correctness.passed == r.correctness.trials >= 1, describe(r)
        assert r.reference is not None and r.candidate is not None, describe(r)
        assert r.candidate.clock == "cuda_event", describe(r)
        assert r.speedup is not None and r.speedup > 0, describe(r)
        assert r.correctness.rechecked >= 2, describe(r)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cuda_inline_ok", "triton_ok"])
def test_fused_kernels_beat_three_eager_kernels(fixture_results, name):
    """One fused pass (~0.4 GB of traffic) against eager's three (~1.2 GB): a timer that cannot
    see this is broken.  The margin is loose on purpose."""
    if uses_triton(FIXTURES / f"{name}.py"):
        pytest.importorskip("triton")
    r = fixture_results[name]
    assert r.status is Status.OK, describe(r)
    assert r.speedup is not None and r.speedup > 1.2, describe(r)


@pytest.mark.gpu
def test_kernel_inventory_tells_custom_kernels_from_pytorch(fixture_results):
    """``no_custom_kernel`` (informational): set for PyTorch-only code, absent for real kernels."""
    pytest.importorskip("triton")
    for name in ("cuda_inline_ok", "triton_ok"):
        r = fixture_results[name]
        assert r.kernels, describe(r)
        assert "no_custom_kernel" not in r.flags, (name, r.kernels)
    honest_graph = fixture_results["cuda_graph_honest"]
    assert "no_custom_kernel" in honest_graph.flags, honest_graph.kernels


@pytest.mark.gpu
def test_calls_that_wait_for_the_device_inside_are_timed_with_shorter_gate_waits(fixture_results):
    """Both sides of ``honest_syncs_inside`` block in every timed call (an ``.item()``): after two
    in a row, each side's gate waits the warm-up's longest issue time instead of four times it,
    and the verdict stands (the events start once the gate opens, whatever it waited)."""
    r = fixture_results["honest_syncs_inside"]
    assert r.status is Status.OK, describe(r)
    calls = r.figures["gpu"]["window"]["calls"] if "window" in r.figures.get("gpu", {}) else 0
    assert calls == 0, r.figures  # every call blocked: no window to check
    assert r.figures["cost"].get("short_waits", 0) >= 10, r.figures["cost"]
    blocked = r.figures["blocked_calls"]  # each side's, counted apart
    assert blocked["reference"] >= 10 and blocked["candidate"] >= 10, blocked


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["side_stream", "side_stream_partial", "stream_event_no_wait"])
def test_side_stream_work_is_charged(fixture_results, name):
    """These candidates run (some of) the reference's work on an unjoined stream: the device-wide
    join must charge it (about the reference's time: the same three kernels, or two fused ones),
    not the ~0 ms (or the partial time) the calling stream shows."""
    r = fixture_results[name]
    assert r.status is Status.REJECTED and "side_stream" in r.flags, describe(r)
    assert r.reference is not None and r.candidate is not None, describe(r)
    assert r.candidate.median_ms >= 0.5 * r.reference.median_ms, describe(r)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cuda_inline_ok", "triton_ok", "cuda_graph_honest"])
def test_slots_cross_by_cuda_ipc_from_a_confined_candidate(fixture_results, name):
    """Inputs and outputs cross the two processes through CUDA IPC, also when the candidate's
    process runs confined under another uid: host memory is a fallback, never the normal path."""
    if uses_triton(FIXTURES / f"{name}.py"):
        pytest.importorskip("triton")
    r = fixture_results[name]
    assert r.status is Status.OK, describe(r)
    assert r.environment.slots == "cuda_ipc", (r.environment.slots, r.environment.isolation.get("ids"))


@pytest.mark.gpu
def test_the_verdict_shows_both_processes_join_cost(fixture_results):
    """Each process measures its device-wide join on the timer's own spin; the verdict shows both
    and what of the excess each side was charged."""
    r = fixture_results["cuda_inline_ok"]
    assert r.status is Status.OK, describe(r)
    join = r.figures["gpu"]["join"]
    assert 0.0 < join["probe_ms"]["reference"] < 1.0 and 0.0 < join["probe_ms"]["candidate"] < 1.0, join
    assert join["base_ms"] >= join["probe_ms"]["reference"] and join["charged_ms"]["reference"] == 0.0, join


@pytest.mark.gpu
def test_illegal_access_is_named(fixture_results):
    r = fixture_results["illegal_access"]
    assert r.status is Status.RUNTIME_ERROR, describe(r)
    assert {"illegal_memory_access", "signal"} & set(r.flags), describe(r)


@pytest.mark.gpu
def test_compile_error_keeps_the_compiler_log(fixture_results):
    r = fixture_results["cuda_compile_error"]
    assert r.status is Status.COMPILE_ERROR, describe(r)
    assert "error" in (r.compile_log + r.message).lower(), describe(r)


# ---- baselines ----------------------------------------------------------------------------------

@pytest.mark.gpu
def test_baselines_on_kernelbench(tmp_path):
    from cudal1.harness import measure_baselines

    source = kernelbench_source()
    if source is None:
        pytest.skip(f"no KernelBench JSONL: set CUDAL1_KERNELBENCH or provide {KERNELBENCH_DEFAULT}")
    tasks = load_tasks(BASELINE_SELECTOR, source=source)
    assert len(tasks) == 3
    # torch.compile's compiling is its own phase, under the build deadline (child/compiling.py):
    # a cold cache needs no more room than the judge's default call limit.
    config = gpu_config(tmp_path / "cache")
    out = measure_baselines(tasks, BASELINE_MODES, config)
    dump("baselines", {f"{t.name}:{m}": out[(t.hash, m)] for t in tasks for m in BASELINE_MODES if (t.hash, m) in out})
    assert len(out) == len(tasks) * len(BASELINE_MODES)
    failures = []
    for task in tasks:
        for mode in BASELINE_MODES:
            r = out[(task.hash, mode)]
            if not (r.status is Status.OK and r.speedup is not None and r.speedup > 0 and r.environment.gpu_name):
                failures.append(f"--- {task.name} / {mode}\n{describe(r)}")
            elif (r.phase_s.get("compile", 0.0) > 0) != (mode == "compile-default"):
                failures.append(f"--- {task.name} / {mode}: compile phase {r.phase_s}")
    assert not failures, "\n".join(failures)


# ---- build cache --------------------------------------------------------------------------------

@pytest.mark.gpu
def test_cached_rebuild_is_fast(fixture_results, batch_config):
    """Two separate evaluate() calls with one cache_dir: the fixture batch built cuda_inline_ok.py
    from an empty cache; judging it again must find the built extension."""
    from cudal1.harness import evaluate

    first = fixture_results["cuda_inline_ok"]
    assert first.status is Status.OK, describe(first)
    assert "build_cached" not in first.flags, describe(first)
    assert first.build_s > 1.0, describe(first)  # it really compiled
    task = load_task_file(TASK_FILE)
    cand = Candidate((FIXTURES / "cuda_inline_ok.py").read_text(), task_hash=task.hash, label="cuda_inline_ok.py")
    (second,) = evaluate(task, [cand], batch_config)
    dump("cached_rebuild", {"first": first, "second": second})
    assert second.status is Status.OK, describe(second)
    assert "build_cached" in second.flags, describe(second)
    assert second.build_s < 1.0, describe(second)


@pytest.mark.gpu
def test_a_helper_with_its_own_gpu_context_is_foreign_work(tmp_path):
    """The two GPU-helper cheats (``_gpu_helper_*.py``).  Unconfined, where nothing stops the helper
    from starting CUDA, the parent's watch sees a context of the candidate's own on the GPU while
    it is timed: ``rejected`` + ``foreign_gpu_work``.  Confined (here at uid 0, its /proc narrowed)
    the helper cannot start CUDA: the candidate fails, or is caught the same way; never ``ok``."""
    from cudal1.harness import evaluate_pairs

    task = load_task_file(FIXTURES / "task_matmul_relu.py")
    names = ["_gpu_helper_while_stopped", "_gpu_helper_always"]
    pairs = [(task, Candidate((FIXTURES / f"{n}.py").read_text(), task_hash=task.hash, label=n)) for n in names]
    free = evaluate_pairs(pairs, gpu_config(tmp_path / "cache", confine_candidates=False))
    confined = evaluate_pairs(pairs, gpu_config(tmp_path / "cache2"))
    dump("helpers", {**{f"{n}_unconfined": r for n, r in zip(names, free)},
                     **{f"{n}_confined": r for n, r in zip(names, confined)}})
    for name, r in zip(names, free):
        assert r.status is Status.REJECTED and "foreign_gpu_work" in r.flags, f"{name}: {describe(r)}"
        assert "outside this judge" not in r.environment.isolation.get("gpu_sharing", ""), r.environment.isolation
    for name, r in zip(names, confined):
        caught = r.status is Status.REJECTED and "foreign_gpu_work" in r.flags
        assert caught or r.status is Status.RUNTIME_ERROR, f"{name}: {describe(r)}"
    left = left_running(b"x @ x", b'print("ready", flush=True)')  # a _gpu_helper_*'s helper: its code is its argv
    assert not left, f"GPU helper(s) {left} outlived their jobs"
