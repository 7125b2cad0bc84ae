"""Shared pytest wiring: the ``gpu`` marker auto-skip, a per-session cache dir, path fixtures,
the smoke stages' primed tiny model (built once per session), and the one runner of the
adversarial fixture corpora (so no test module imports another).

Markers (``gpu``, ``slow``) are registered in ``pyproject.toml``.

Fixture corpora (``tests/fixtures/cpu``, ``gpu``, ``numerics``): one candidate per file, whose
leading comment block is its header::

    # expect: <status> [flag] [| <status> [flag] ...]   first line; alternatives when the same cheat
                                                       is legitimately caught at different points
    # task: <file>        optional: the task it is judged against, relative to the fixture's folder
                          or to the repository root (default: the module's CORPUS_TASK)
    # xfail: <reason>     optional: a known judge gap; the expectation is the *correct* verdict
    # max-speedup: <x>    optional: an ``ok`` verdict must not be credited a larger speedup (cheats
                          that only slow the reference must end at their true speed)
    # timeout: <s>        optional: the judge's per-phase limit (EvalConfig.timeout_s) for this
                          fixture, instead of the module's ``corpus_config``'s (a hang need not wait
                          out the headroom the slowest honest fixture needs); such fixtures are
                          judged apart from the rest, one batch per limit
    # cpu-too             optional (GPU fixtures): the guard does not depend on the device, so the
                          CPU corpus judges it too

A test module that holds a corpus sets ``CORPUS`` (fixture paths), ``CORPUS_TASK`` (the default
task file) and optionally ``CORPUS_SELECT`` (entry -> bool: which parsed entries it judges), and
defines a module-scoped ``corpus_config`` fixture (the judge's EvalConfig).  It then
gets ``corpus`` (name -> :class:`CorpusEntry`), ``corpus_results`` (name -> EvalResult, all judged
in one ``evaluate_pairs`` batch but those with a ``# timeout:`` line) and, for a test taking a
``corpus_name`` argument, one test per fixture (xfail-marked where the header says so);
``expected_verdict(entry, result)`` says what is wrong with a verdict ("" when it matches).  Names
are file stems.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli_support import SMALL_DIAG
from tiers import mark_tiers, pytest_runtest_makereport, pytest_runtest_protocol  # noqa: F401 - hooks of the tiers

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    # caches (builds, graph rewrites) go to a per-session directory, never the user's ~/.cache
    os.environ.setdefault("CUDAL1_CACHE_DIR", tempfile.mkdtemp(prefix="cudal1-test-cache-"))
    # One intra-op thread in this process and every judge worker and CLI child it starts (set
    # before torch is imported and before the judge's forkserver starts).  On a loaded host a
    # parallel op whose sibling thread is descheduled waits out a scheduler slice (~4 ms) at its
    # barrier whatever its work, so the CPU judge's speedups measured slices, not work: the 512x512
    # diag broadcast (512x less work than the matmul) read anywhere from 0.98x to 89x with two
    # threads under load, 28x-54x with one.  Tests that assert "measured faster/slower" rely on
    # their work margins, which this makes what a call's time measures.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Inductor's CPU backend probes each SIMD ISA the CPU reports by compiling and loading a test
    # program, once per TORCHINDUCTOR_CACHE_DIR; the judge gives every candidate and every task's
    # baselines a cache of their own under the test's fresh cache dir, so each torch.compile in a test
    # paid the probes again (~8 s of a ~13 s cold compile on a 2-core box).  The compiler that builds
    # the kernels is the one the probes would check: take the CPU's word for its ISA.
    os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.hookimpl(tryfirst=True)  # before -m selects on the tier markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_tiers(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():  # torch is imported only when a gpu test exists
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_dir(repo_root: Path) -> Path:
    path = repo_root.parent / "shared"
    if not path.is_dir():
        pytest.skip(f"shared directory {path} is absent")
    return path


@pytest.fixture(scope="session")
def deepspeed_cpu_ops() -> None:
    """DeepSpeed's CPU communication op (``deepspeed_shm_comm``, compiled on first use: about a
    minute), built once per session in a process of its own, so no training job's time limit pays
    for it.  It lands in torch's extension cache (``TORCH_EXTENSIONS_DIR``, else
    ``~/.cache/torch_extensions``), where a later session finds it."""
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"building DeepSpeed's CPU op failed: {proc.stderr[-2000:]}")


@pytest.fixture
def hf_hub_imported_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """``huggingface_hub`` and ``datasets`` imported while the hub counted as online (flags and
    environment as without ``HF_HUB_OFFLINE``), as where an earlier test imported them: they read
    the offline flags once, at import, so ``tasks.load_task_hf``'s switch to offline mode must
    reach those flags too.  Its switch lasts for the process; after the test, the environment and
    the flags are as before."""
    pytest.importorskip("datasets")
    import importlib

    from cudal1.tasks import HUB_OFFLINE_FLAGS

    for name in {n for names in HUB_OFFLINE_FLAGS.values() for n in names}:
        monkeypatch.delenv(name, raising=False)
    for module, names in HUB_OFFLINE_FLAGS.items():
        imported = importlib.import_module(module)
        for name in names:
            monkeypatch.setattr(imported, name, False)


@pytest.fixture(scope="session")
def primed_smoke_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``--smoke`` GRPO/SSL stages' primed tiny model (``smoke_stages.primed_model``: a short
    SFT on every bundled program), built once per session in this process; priming is about two
    thirds of a two-process smoke's time.  Use :func:`seed_primed` to give it to a run."""
    pytest.importorskip("trl")
    from cudal1.train.smoke.stages import primed_model

    return primed_model(tmp_path_factory.mktemp("smoke-prime"))


@pytest.fixture
def seed_primed(primed_smoke_model: Path):
    """``seed(out)``: copy the session's primed model to ``out/prime/primed``, where a ``--smoke``
    run of ``out`` finds and reuses it (as ``--resume`` does) instead of priming again.  Priming
    itself under several processes is the SFT smoke's path (``tiny_base`` by rank 0, a
    data-parallel ``run_sft``), tested by itself."""
    import shutil

    def seed(out: Path) -> None:
        shutil.copytree(primed_smoke_model, Path(out) / "prime" / "primed")

    return seed


# ---- fixture corpora ------------------------------------------------------------------------------

_EXPECT = re.compile(r"#\s*expect:\s*(.+?)\s*$")
_ALTERNATIVE = re.compile(r"^([a-z_]+)(?:\s+([a-z0-9_]+))?$")
_FIELD = re.compile(r"#\s*(task|xfail|max-speedup|timeout):\s*(.+?)\s*$")


@dataclass(frozen=True)
class CorpusEntry:
    path: Path
    expect: tuple[tuple[str, str | None], ...]  # alternatives: (status, flag or None)
    task: Path | None  # from '# task:' (resolved); None = the module's CORPUS_TASK
    xfail: str | None  # known judge gap, from '# xfail:'
    cpu_too: bool  # '# cpu-too'
    max_speedup: float | None = None  # '# max-speedup: X': an ``ok`` verdict must not be credited more
    timeout_s: float | None = None  # '# timeout: S': its own per-phase limit; None = corpus_config's

    @property
    def name(self) -> str:
        return self.path.stem


def read_corpus_entry(path: Path) -> CorpusEntry:
    """Parse ``path``'s header (see the module docstring); ValueError on a malformed one."""
    from cudal1.flags import FLAGS
    from cudal1.types import Status

    lines = path.read_text().splitlines()
    m = _EXPECT.match(lines[0]) if lines else None
    if not m:
        raise ValueError(f"{path}: first line must be '# expect: <status> [flag] [| <status> [flag] ...]'")
    expect = []
    for alt in m.group(1).split("|"):
        a = _ALTERNATIVE.match(alt.strip())
        if not a:
            raise ValueError(f"{path}: bad expectation {alt.strip()!r}")
        Status(a.group(1))  # a misspelt status fails here, loudly
        if a.group(2) is not None and a.group(2) not in FLAGS:
            raise ValueError(f"{path}: {a.group(2)!r} is not a flag of cudal1/flags.py")
        expect.append((a.group(1), a.group(2)))
    fields: dict[str, str] = {}
    cpu_too = False
    for line in lines[1:]:
        if not line.startswith("#"):
            break  # the header is the leading comment block
        f = _FIELD.match(line)
        if f:
            fields.setdefault(f.group(1), f.group(2))
        cpu_too = cpu_too or line.strip() == "# cpu-too"
    task = None
    if "task" in fields:
        candidates = (path.parent / fields["task"], REPO_ROOT / fields["task"])
        task = next((c for c in candidates if c.is_file()), None)
        if task is None:
            raise ValueError(f"{path}: '# task: {fields['task']}' is neither in {path.parent} nor in the repository")
    bound = float(fields["max-speedup"]) if "max-speedup" in fields else None
    timeout_s = float(fields["timeout"]) if "timeout" in fields else None
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"{path}: '# timeout: {fields['timeout']}' is not a positive number of seconds")
    return CorpusEntry(path, tuple(expect), task, fields.get("xfail"), cpu_too, bound, timeout_s)


def _module_corpus(module: Any) -> dict[str, CorpusEntry]:
    cached = getattr(module, "_corpus_entries", None)
    if cached is None:
        files = list(module.CORPUS)
        if not files:
            raise ValueError(f"{module.__name__}: CORPUS is empty")
        entries = [read_corpus_entry(f) for f in files]  # every header is checked, selected or not
        select = getattr(module, "CORPUS_SELECT", None)
        cached = {e.name: e for e in entries if select is None or select(e)}
        if len({e.name for e in entries}) != len(files):
            raise ValueError(f"{module.__name__}: two corpus files share a name")
        module._corpus_entries = cached
    return cached


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "corpus_name" in metafunc.fixturenames:
        params = []
        for name, entry in sorted(_module_corpus(metafunc.module).items()):
            marks = [pytest.mark.xfail(strict=False, reason=f"known judge gap: {entry.xfail}")] if entry.xfail else []
            params.append(pytest.param(name, marks=marks, id=name))
        metafunc.parametrize("corpus_name", params)


@pytest.fixture(scope="module")
def corpus(request: pytest.FixtureRequest) -> dict[str, CorpusEntry]:
    return _module_corpus(request.module)


@pytest.fixture(scope="module")
def corpus_results(request: pytest.FixtureRequest, corpus: dict[str, CorpusEntry]) -> dict[str, Any]:
    """Every entry of the module's corpus judged, each against its own task: in one batch with the
    module's ``corpus_config``, but for entries with their own ``# timeout:``, judged after it in one
    batch per limit (that config with ``timeout_s`` replaced)."""
    from cudal1.harness import evaluate_pairs
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate

    config = request.getfixturevalue("corpus_config")
    default = request.module.CORPUS_TASK
    entries = list(corpus.values())
    tasks = {t: load_task_file(t) for t in {e.task or default for e in entries}}
    limits = sorted({e.timeout_s for e in entries if e.timeout_s is not None})
    judged: dict[str, Any] = {}
    for limit in [None, *limits]:
        group = [e for e in entries if e.timeout_s == limit]
        if not group:
            continue
        pairs = []
        for e in group:
            task = tasks[e.task or default]
            pairs.append((task, Candidate(e.path.read_text(), task_hash=task.hash, label=e.name)))
        results = evaluate_pairs(pairs, config if limit is None else config.replace(timeout_s=limit))
        assert len(results) == len(pairs), "evaluate_pairs() must return one result per pair, in order"
        for (task, cand), r in zip(pairs, results):
            assert r.task_hash == task.hash and r.candidate_hash == cand.hash, "results are out of input order"
        judged.update((e.name, r) for e, r in zip(group, results))
    return {e.name: judged[e.name] for e in entries}


def expected_verdict(entry: CorpusEntry, result: Any) -> str:
    """"" when ``result`` matches one of ``entry``'s alternatives, else what went wrong."""
    for status, flag in entry.expect:
        if result.status.value == status and (flag is None or flag in result.flags):
            if status == "ok" and entry.max_speedup is not None and (result.speedup or 0.0) > entry.max_speedup:
                return (f"{entry.name}: ok, but credited {result.speedup:.3g}x, more than its true speed allows "
                        f"({entry.max_speedup}x)")
            return ""
    return (f"{entry.name}: want one of {list(entry.expect)}; got status={result.status.value} flags={result.flags} "
            f"phase={result.phase} message={result.message[:400]!r}")


@pytest.fixture(scope="session")
def check_verdict():
    """``expected_verdict`` as a fixture (test modules do not import conftest)."""
    return expected_verdict


@pytest.fixture(scope="session")
def cpu_judge_config():
    """A factory of the small CPU judge config the CPU corpora use: ``(cache_dir, **changes)``."""
    def make(cache_dir: Path, **changes: Any):
        from cudal1.config import EvalConfig

        base = dict(device="cpu", cache_dir=str(cache_dir), timeout_s=15.0, timing_budget_s=0.5, timing_trials=20,
                    min_timing_trials=5, correctness_trials=3, bootstrap_samples=500)
        return EvalConfig(**(base | changes))

    return make


@pytest.fixture(scope="session")
def judged_broadcast(tmp_path_factory: pytest.TempPathFactory):
    """``cudal1 judge --json`` of the bundled broadcast candidate against the small diag_matmul under
    the small CPU config (``cli_support.small_config``), run once: the CompletedProcess that every
    test asserting on this plain verdict reads (its contract keys, and no profile without
    ``--profile``)."""
    from cli_support import cli_env, run_cli, small_config

    tmp = tmp_path_factory.mktemp("judged-broadcast")
    config = tmp / "small.yaml"
    config.write_text(small_config(timeout_s=60.0))
    candidate = REPO_ROOT / "examples" / "candidates" / "diag_matmul_broadcast.py"
    return run_cli(["judge", "--reference", SMALL_DIAG, "--candidate", candidate, "--config", config, "--json"],
                   cli_env(tmp / "cache"), tmp)


@pytest.fixture
def shared_device_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo_root: Path):
    """``run(device, share, **settings)``: judge ``2 * share`` copies of the bundled diag_matmul
    candidate with ``workers_per_gpu = share`` (and the judge's other ``settings``, e.g.
    ``lease_order``) through the real judge, and check the GPU lease held: every job
    ``ok``, no job's ``timing`` phase overlapping another job's GPU phases (worker clocks), and
    workers that did run side by side.  Returns (results, batch stats)."""
    from cudal1.config import EvalConfig
    from cudal1.harness.parent.api import DevicePlan, Job, run_jobs
    from cudal1.harness.parent.batchstats import GPU_PHASES, StatsRecorder
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate, Status

    timelines: list[list[tuple[str, float, float]]] = []
    real = StatsRecorder.gpu_phases

    def capture(self: Any, gpu: Any, timeline: list[tuple[str, float, float]]) -> None:
        timelines.append(list(timeline))
        real(self, gpu, timeline)

    monkeypatch.setattr(StatsRecorder, "gpu_phases", capture)

    def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return a[0] < b[1] and b[0] < a[1]

    def run(device: str, share: int, **settings: Any) -> tuple[list[Any], Any]:
        task = load_task_file(SMALL_DIAG)
        code = (repo_root / "examples" / "candidates" / "diag_matmul_broadcast.py").read_text()
        jobs = [
            Job(task, Candidate(code + f"\n# variant {i}\n", task_hash=task.hash, label=f"v{i}"))
            for i in range(2 * share)
        ]
        cfg = EvalConfig(device=device, cache_dir=str(tmp_path / "cache"), correctness_trials=2, timing_trials=20,
                         min_timing_trials=5, timing_budget_s=0.5, workers_per_gpu=share, **settings)
        plan = DevicePlan.detect(device)
        plan = DevicePlan(plan.device, plan.lanes[:1], plan.arch_list, plan.driver)  # one device, shared
        stats: list[Any] = []
        results = run_jobs(jobs, cfg, plan=plan, on_stats=stats.append)
        assert [r.status for r in results] == [Status.OK] * len(jobs), [r.message for r in results]
        assert len(timelines) == len(jobs)
        timing = [[(a, b) for name, a, b in t if name == "timing"] for t in timelines]
        busy = [[(a, b) for name, a, b in t if name in GPU_PHASES] for t in timelines]
        for i, mine in enumerate(timing):
            assert mine, timelines[i]
            for j, other in enumerate(busy):
                if j != i:
                    assert not any(overlaps(x, y) for x in mine for y in other), (i, j, timelines[i], timelines[j])
        # Side by side: the lanes take their first jobs at once (nothing to build), and each job
        # runs for seconds (two processes start, the reference is prepared), so the first jobs
        # of the lanes overlap by construction; a lease that serialised whole jobs would fail here.
        spans = sorted((t[0][1], t[-1][2]) for t in timelines)
        assert any(overlaps(spans[k], spans[k + 1]) for k in range(len(spans) - 1))
        assert stats[0].gpu_span_s > 0 and 0.0 <= stats[0].gpu_idle_share < 1.0
        return results, stats[0]

    return run
