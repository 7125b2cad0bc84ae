"""The baselines' compile cache (``EvalConfig.baseline_cache``): the baselines of one task share
one persistent torch.compile/Triton cache, so a mode compiled once is found again (a re-timing, a
resumed run); nothing a candidate runs writes there; switched off, each baseline job compiles
into a directory of its own that goes with the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_support import SMALL_DIAG
from cudal1.config import ConfigError, EvalConfig
from cudal1.harness.parent.evaluator import Evaluator
from cudal1.harness.parent.plan import DevicePlan, Job
from cudal1.tasks import load_tasks
from cudal1.types import Candidate, Task


def _cache_dirs(tmp_path: Path, job: Job, **config) -> str:
    cfg = EvalConfig(device="cpu", cache_dir=str(tmp_path / "cache"), **config)
    ev = Evaluator(cfg, DevicePlan.detect("cpu"))
    work = tmp_path / f"job{len(list(tmp_path.iterdir()))}"
    work.mkdir()
    _, cand = ev._specs(job, work, "cpu", None, "baseline" if job.baseline_mode else "eval")
    return cand.env.get("TORCHINDUCTOR_CACHE_DIR", "") + "|" + cand.confine.get("build_dir", "")


def test_a_tasks_baselines_share_one_cache_candidates_never_reach_it(tmp_path):
    task, other = Task("t", "class Model: pass\n"), Task("u", "class Model: pass  # u\n")
    default = _cache_dirs(tmp_path, Job(task, None, "compile-default"))
    assert "/baselines/" in default and str(tmp_path / "cache") in default
    assert _cache_dirs(tmp_path, Job(task, None, "compile-max-autotune")) == default  # every mode of the task
    assert _cache_dirs(tmp_path, Job(other, None, "compile-default")) != default  # another task: its own
    cand = _cache_dirs(tmp_path, Job(task, Candidate("class ModelNew: pass\n", task_hash=task.hash)))
    assert "/builds/" in cand and "/baselines/" not in cand  # a candidate keeps its own build directory
    off = _cache_dirs(tmp_path, Job(task, None, "compile-default"), baseline_cache=False)
    assert "/baselines/" not in off and off.endswith("/build")  # inside the job's directory, removed with it


def test_the_cache_switch_leaves_the_verdicts_key_alone():
    assert EvalConfig(baseline_cache=False).hash() == EvalConfig().hash()


@pytest.mark.cpu
def test_a_second_baseline_of_the_same_mode_compiles_nothing_new(tmp_path):
    from cudal1.harness.parent.api import time_baselines

    task = load_tasks(str(SMALL_DIAG))[0]
    cfg = EvalConfig.preset("fast").replace(device="cpu", cache_dir=str(tmp_path / "cache"))
    root = tmp_path / "cache" / "baselines"

    def files() -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    first = time_baselines([(task, "compile-default")], cfg)[0]
    assert first.status.value == "ok", first.message
    compiled = files()
    assert [p.parent.parent.name for p in root.rglob("fxgraph/*/*")] == ["fxgraph"]  # one compiled graph
    second = time_baselines([(task, "compile-default")], cfg)[0]
    assert second.status.value == "ok", second.message
    assert files() == compiled  # found in the cache: no graph, kernel or library written again
    # Inductor's compiling is its own phase (the build deadline, child.compiling), taken out of
    # the first call's correctness: the cold compile writes C++ and builds it, the second loads it.
    assert first.phase_s.get("compile", 0) > second.phase_s.get("compile", 0) > 0, (first.phase_s, second.phase_s)


def test_inductor_is_imported_before_the_gpu_lease_only_where_the_job_compiles(tmp_path):
    """Inductor's import (seconds) moves from ``construct`` (GPU lease held shared) to the import
    phase (no lease) for compile-mode baselines and candidates that call torch.compile; on a GPU
    compile-mode baselines construct and check correctness (where they compile) under the
    exclusive lease."""
    from types import SimpleNamespace

    from cudal1.harness.reference.worker import RefWorker
    from cudal1.harness.spec import CandidateSettings, CandidateSpec, names_triton
    from cudal1.harness.spec import calls_torch_compile as _compiles

    def spec(mode: str, baseline: str | None = None, source: str | None = None) -> CandidateSpec:
        path = None
        if source is not None:
            path = tmp_path / f"cand{len(list(tmp_path.iterdir()))}.py"
            path.write_text(source)
        return CandidateSpec(mode=mode, device="cpu", settings=CandidateSettings.of(EvalConfig()), reference_path="r",
                             reference_module="r", log_path="l", candidate_path=str(path) if path else None,
                             baseline_mode=baseline)

    assert _compiles(spec("baseline", "compile-default")) and _compiles(spec("baseline", "max-autotune"))  # alias
    assert not _compiles(spec("baseline", "cudagraph")) and not _compiles(spec("baseline", "eager"))
    assert _compiles(spec("eval", source="self.f = torch.compile(self.f)\n"))
    assert not _compiles(spec("eval", source="class ModelNew: pass\n"))
    assert not _compiles(spec("build", source="torch.compile\n"))  # the CPU pre-build never compiles for the GPU
    assert names_triton(spec("eval", source="import triton\n")) and not names_triton(spec("eval", source="x = 1\n"))
    assert not names_triton(spec("build", source="import triton\n"))
    assert CandidateSettings.of(EvalConfig()).compile_off_lease  # on by default since the GPU tests passed
    assert not CandidateSettings.of(EvalConfig(compile_off_lease=False)).compile_off_lease

    def lease(device: str, job: CandidateSpec, config: EvalConfig | None = None) -> str:
        on = SimpleNamespace(**{**{k: getattr(job, k) for k in ("mode", "baseline_mode", "candidate_path")},
                                "device": device})
        worker = RefWorker.__new__(RefWorker)
        worker.spec, worker.cfg = on, config or EvalConfig()  # type: ignore[assignment]
        return worker.construct_lease()

    mnac = spec("baseline", "compile-max-autotune-no-cudagraphs")
    assert lease("cuda", mnac) == "exclusive"
    # baseline_lease: choosers, a candidate's rule (shared; exclusive while a choice is made by timing),
    # which needs compiling off the lease: without it the baseline keeps the exclusive lease
    assert lease("cuda", mnac, EvalConfig(baseline_lease="choosers")) == "shared"
    assert lease("cuda", mnac, EvalConfig(baseline_lease="choosers", compile_off_lease=False)) == "exclusive"
    assert EvalConfig(baseline_lease="choosers").hash() == EvalConfig().hash()  # where the lease is held only
    with pytest.raises(ConfigError, match="baseline_lease"):
        EvalConfig(baseline_lease="shared")
    assert lease("cuda", spec("eval", source="m = torch.compile(m)\n")) == "shared"  # a candidate's choices are its own
    assert lease("cuda", spec("baseline", "cudagraph")) == "shared"
    assert lease("cuda", spec("eval", source="class ModelNew: pass\n")) == "shared"
    assert lease("cpu", spec("baseline", "compile-default")) == "shared"  # no GPU kernels timed while compiling
