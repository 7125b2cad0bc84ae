"""The build farm (CPU tier, no compiler run): budget sizing, the build-directory file lock
across processes, one build per distinct source (within a batch and across processes), stale
torch batons, and the build targets and MAX_JOBS a worker is handed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cudal1.config import EvalConfig
from cudal1.harness import build
from cudal1.harness.envinfo import Gpu
from cudal1.harness.parent.evaluator import Evaluator
from cudal1.harness.parent.farm import BuildBudget, BuildFarm
from cudal1.harness.parent.plan import DevicePlan, Job
from cudal1.types import Candidate, Task

SRC = Path(__file__).resolve().parents[1] / "src"
TASK = Task(name="t", source="import torch\nclass Model(torch.nn.Module):\n    pass\n")


def cand(tag: str) -> Candidate:
    return Candidate(f"from torch.utils.cpp_extension import load_inline  # {tag}\n", task_hash=TASK.hash, label=tag)


@dataclass
class FakeOutcome:
    wall_s: float = 1.0
    built: object = None
    timed_out: bool = False


# ---- budget ------------------------------------------------------------------------------------

@pytest.mark.parametrize("requested,lanes,cores,mem,workers,max_jobs", [
    (0, 1, 16, 128.0, 7, 2),   # 15 cores for builds, 2 compile units per load_inline build
    (0, 2, 16, 128.0, 7, 2),
    (4, 1, 16, 128.0, 4, 3),   # the compiler gets what the builds leave
    (16, 1, 16, 128.0, 16, 1),
    (1, 1, 16, 128.0, 1, 15),
    (0, 1, 16, 8.0, 2, 2),     # memory: 4 compilers of 2 GiB
    (0, 1, 2, None, 1, 1),     # this box
])
def test_budget_adds_up_to_the_machine(requested, lanes, cores, mem, workers, max_jobs):
    b = BuildBudget.detect(requested, lanes, cores=cores, memory_gib=mem)
    assert (b.workers, b.max_jobs) == (workers, max_jobs)
    if requested <= cores - lanes:
        assert b.workers * b.max_jobs <= max(1, cores - lanes)


def test_budget_is_not_bounded_by_lanes():
    one = BuildBudget.detect(0, 1, cores=32, memory_gib=256.0)
    assert one.workers > 1  # one GPU still gets many concurrent builds


# ---- build targets and compiler parallelism handed to workers ---------------------------------

def test_arch_list_names_each_present_capability_once(monkeypatch):
    from cudal1.harness.parent import plan as plan_module

    inventory = [Gpu(0, "H200", "570", "9.0"), Gpu(1, "H200", "570", "9.0"), Gpu(2, "A100", "570", "8.0")]
    monkeypatch.setattr(plan_module, "gpu_inventory", lambda: inventory)
    assert DevicePlan.detect("cuda").arch_list == "8.0;9.0"
    assert DevicePlan.detect("cuda", [0, 1]).arch_list == "9.0"  # only the GPUs judged on
    assert "PTX" not in DevicePlan.detect("auto").arch_list


def test_prebuild_spec_targets_the_plan_and_the_budget(tmp_path):
    plan = DevicePlan("cuda", (0,), "9.0", "570")
    ev = Evaluator(EvalConfig(device="cpu", cache_dir=str(tmp_path)), plan, max_jobs=3)
    reference, spec = ev._specs(Job(TASK, cand("a")), tmp_path, "cpu", None, "build")
    assert reference is None  # a pre-build is the candidate's process alone
    assert spec.env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert spec.env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU in a pre-build: torch would target every arch
    assert spec.env["MAX_JOBS"] == "3"
    assert spec.env["TORCH_EXTENSIONS_DIR"] == str(ev.build_dir(Job(TASK, cand("a"))))


# ---- the file lock ---------------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from cudal1.harness import build
    with build.locked(Path(sys.argv[1])):
        print("locked", flush=True)
        time.sleep(60)
""")


@pytest.mark.cpu
def test_file_lock_excludes_another_process_and_dies_with_it(tmp_path):
    env = os.environ | {"PYTHONPATH": str(SRC)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        acquired = threading.Event()

        def take() -> None:
            with build.locked(tmp_path):
                acquired.set()

        t = threading.Thread(target=take, daemon=True)
        t.start()
        assert not acquired.wait(1.0), "the lock was taken while another process held it"
        holder.send_signal(signal.SIGKILL)  # the kernel drops the dead holder's lock
        assert acquired.wait(10.0), "the lock of a killed holder was not released"
        t.join(10.0)  # the thread sets the event inside its lock: wait until it has let go
        assert not t.is_alive()
    finally:
        holder.kill()
        holder.wait()
    import fcntl

    with open(tmp_path / ".cudal1.lock", "a") as f:  # nobody holds it now: a non-blocking lock succeeds
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


TWO_RUNS = textwrap.dedent("""
    import sys, threading, time
    from pathlib import Path
    from cudal1.harness import build
    from cudal1.harness.parent.farm import BuildBudget, BuildFarm

    class Out:
        wall_s, built, timed_out = 1.0, None, False

    bdir = Path(sys.argv[1])
    def prebuild(job):
        lib = bdir / "ext.so"
        if lib.exists():
            return Out(), True
        time.sleep(1.5)  # a compiler
        with open(bdir.parent / "builds.log", "a") as f:
            f.write(sys.argv[2] + "\\n")
        lib.write_text("x")
        return Out(), False

    farm = BuildFarm(prebuild, lambda job: bdir, BuildBudget(1, 1, 1, None), threading.Condition())
    print(sys.argv[2], farm.submit("job").future.result()[1], flush=True)
    farm.shutdown()
""")


@pytest.mark.cpu
def test_two_processes_sharing_the_cache_build_a_source_once(tmp_path):
    bdir = tmp_path / "builds" / "key"
    env = os.environ | {"PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen([sys.executable, "-c", TWO_RUNS, str(bdir), name], stdout=subprocess.PIPE, text=True, env=env)
        for name in ("a", "b")
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len((tmp_path / "builds" / "builds.log").read_text().split()) == 1, "both runs compiled the source"
    assert sorted(o[1] for o in outs) == ["False", "True"]  # one built it, the other found it


# ---- one build per distinct source within a batch ---------------------------------------------------

def test_identical_sources_are_built_once(tmp_path):
    calls: list[str] = []
    ready = threading.Condition()

    def prebuild(job: Job):
        calls.append(job.candidate.label)
        time.sleep(0.3)
        return FakeOutcome(wall_s=2.0), False

    ev = Evaluator(EvalConfig(device="cpu", cache_dir=str(tmp_path)), DevicePlan("cpu", (None,), ""))
    farm = BuildFarm(prebuild, ev.build_dir, BuildBudget(4, 1, 4, None), ready)
    same = [cand("x"), cand("x"), Candidate(cand("x").source, task_hash="other", label="x-other-task")]
    tickets = [farm.submit(Job(TASK, c)) for c in same] + [farm.submit(Job(TASK, cand("y")))]
    for t in tickets:
        t.result() if t.leader is not None else t.future.result()
    farm.shutdown()
    assert sorted(calls) == ["x", "y"]
    leader, followers = tickets[0], tickets[1:3]
    assert all(f.leader is leader for f in followers)
    outcome, cached = followers[0].result()
    assert cached and outcome.wall_s == 0.0  # the leader paid for it
    assert leader.result() == (FakeOutcome(wall_s=2.0), False)


def test_stale_batons_are_cleared(tmp_path):
    old, fresh = tmp_path / "ext_old" / "lock", tmp_path / "ext_new" / "lock"
    for f in (old, fresh):
        f.parent.mkdir()
        f.write_text("")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert build.clear_stale_batons(tmp_path, older_than_s=3600) == [old]
    assert fresh.exists() and not old.exists()
    assert build.clear_stale_batons(tmp_path, since=time.time() - 60) == [fresh]


def test_a_timed_out_build_leaves_no_baton(tmp_path):
    bdir = tmp_path / "b"

    def prebuild(job):
        (bdir / "ext").mkdir(parents=True)
        (bdir / "ext" / "lock").write_text("")  # what torch's FileBaton leaves when nvcc is SIGKILLed
        return FakeOutcome(timed_out=True), False

    farm = BuildFarm(prebuild, lambda job: bdir, BuildBudget(1, 1, 1, None), threading.Condition())
    farm.submit("job").future.result()
    farm.shutdown()
    assert not (bdir / "ext" / "lock").exists()


# ---- lazily built extensions are pre-built too -------------------------------------------------------

def test_builds_lazily_tells_module_level_from_init_builds():
    assert not build.builds_lazily("from torch.utils.cpp_extension import load_inline\next = load_inline(name='a')\n")
    assert build.builds_lazily("class ModelNew:\n    def __init__(self):\n        self.ext = load_inline(name='a')\n")
    assert build.builds_lazily(
        "import torch.utils.cpp_extension as c\ndef _get():\n    return c.load(name='a', sources=[])\n"
    )
    assert not build.builds_lazily("def broken(:\n")
    assert not build.builds_lazily("import triton.language as tl\ndef k(p):\n    return tl.load(p) + torch.load('w')\n")
    src = "class ModelNew:\n    def __init__(self):\n        load_inline(name='a')\n"
    assert build.prebuild_source(src, "ref_mod").startswith(src) and "ref_mod" in build.prebuild_source(src, "ref_mod")
    assert build.prebuild_source("x = load_inline(name='a')\n", "ref_mod") == "x = load_inline(name='a')\n"


LAZY = '''
import torch
import torch.nn as nn

MARK = %(mark)r


def load_inline(**kwargs):  # stands in for torch's: records that the pre-build reached the build call
    with open(MARK, "w") as f:
        f.write(",".join(sorted(kwargs)))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        load_inline(name="lazy_ext", cpp_sources="")
        self.big = nn.Parameter(torch.empty(1 << 32))  # 16 GiB: only affordable on the meta device

    def forward(self, A, B):
        return A.unsqueeze(1) * B
'''


def _prebuild(tmp_path: Path, config_factory, template: str) -> tuple[Any, bool, Path]:
    """Pre-build ``template`` (a candidate with a ``%(mark)r`` file its stand-in ``load_inline``
    writes) for the bundled diag_matmul task: (outcome, was_cached, mark)."""
    from cudal1.tasks import load_task_file

    task = load_task_file(Path(__file__).resolve().parents[1] / "examples" / "tasks" / "diag_matmul.py")
    mark = tmp_path / "built"
    cand = Candidate(template % {"mark": str(mark)}, task_hash=task.hash, label="prebuild")
    # the stand-in writes its mark outside the build directory: a confined candidate may not
    ev = Evaluator(config_factory(tmp_path / "cache", confine_candidates=False), DevicePlan("cpu", (None,), ""))
    outcome, cached = ev.prebuild(Job(task, cand))
    assert outcome.result is not None and outcome.result.status == "ok", outcome.log_tail[-2000:]
    return outcome, cached, mark


@pytest.mark.cpu
def test_prebuild_constructs_candidates_that_build_in_init(tmp_path, cpu_judge_config):
    _, cached, mark = _prebuild(tmp_path, cpu_judge_config, LAZY)
    assert mark.read_text() == "cpp_sources,name"  # __init__ ran in the pre-build, up to its build call
    assert not cached


FORWARD_BUILD = '''
import torch
import torch.nn as nn

MARK = %(mark)r


def load_inline(**kwargs):  # stands in for torch's: records that the pre-build reached the build call
    with open(MARK, "a") as f:
        f.write(kwargs["name"] + "\\n")


if torch.cuda.is_available():  # module-level build behind the usual guard
    load_inline(name="guarded_ext")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1 << 32))  # 16 GiB: affordable only without data
        self.ext = None

    def forward(self, A, B):
        if not (torch.cuda.is_available() and A.is_cuda and self.scale.is_cuda):
            return A.unsqueeze(1) * B
        if self.ext is None:
            self.ext = load_inline(name="forward_ext")  # first reached in forward, on CUDA inputs only
        return A.unsqueeze(1) * B
'''


@pytest.mark.cpu
def test_prebuild_reaches_builds_behind_gpu_checks_in_forward(tmp_path, cpu_judge_config):
    _, _, mark = _prebuild(tmp_path, cpu_judge_config, FORWARD_BUILD)
    assert mark.read_text().split() == ["guarded_ext", "forward_ext"]


# ---- failed builds are remembered by what they compile -----------------------------------------

def test_failed_build_memo_ignores_per_process_names_and_honours_build_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.chdir(tmp_path)  # the worker's per-candidate directory
    calls = []

    def fake_load_inline(name, cpp_sources, cuda_sources=None, build_directory=None, **kw):
        calls.append(name)
        raise RuntimeError(f"Error building extension '{name}': nvcc said no")

    built = []
    load = build._memoize(fake_load_inline, built.append)
    for pid in (101, 202):  # names made per process, other than this process's id
        with pytest.raises(RuntimeError, match="Error building extension"):
            load(f"ext_{pid}", "int f();", cuda_sources="__global__ void k() {}")
    assert calls == ["ext_101"]  # the second one replayed the recorded failure
    with pytest.raises(RuntimeError):
        load(name=f"own_{os.getpid()}", cpp_sources="int h();")  # this process's id: a stable name
    assert calls[-1] == "own_pid"
    calls.remove("own_pid")
    with pytest.raises(RuntimeError):
        load("ext_303", "int f();", cuda_sources="__global__ void k2() {}")  # other sources: built
    assert calls == ["ext_101", "ext_303"]
    for _ in range(2):  # a relative build_directory: recorded there (the candidate's own directory)
        with pytest.raises(RuntimeError):
            load("ext_rel", "int g();", build_directory="cuda_extensions")
    assert calls[-1] == "ext_rel" and calls.count("ext_rel") == 1
    assert len(list((tmp_path / "cuda_extensions").glob(".cudal1_build_failed-*"))) == 1
    assert built == [True, False] * 4  # building() told only around real builds


LAZY_MEMO = """
import sys
from cudal1.harness import build
build.install_memo()
build.install_memo()  # twice: one finder
print(sys.modules.get("torch.utils.cpp_extension") is None,
      sum(isinstance(f, build._WrapOnImport) for f in sys.meta_path))
from torch.utils.cpp_extension import load_inline
import torch.utils.cpp_extension as ext
print(getattr(load_inline, "_cudal1_memo", False), getattr(ext.load, "_cudal1_memo", False))
import inspect
print(bool(inspect.getsource(ext.include_paths)))
"""


@pytest.mark.cpu
def test_the_build_memo_waits_for_the_extension_module_to_be_imported():
    """The loaders are wrapped as ``torch.utils.cpp_extension`` is imported, not before: the
    candidate's process does not pay its import (setuptools) unless the candidate builds."""
    out = subprocess.run([sys.executable, "-c", LAZY_MEMO], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "1", "True", "True", "True"]


@pytest.mark.cpu
def test_worker_runs_in_the_candidates_own_directory(tmp_path, cpu_judge_config):
    from cudal1.tasks import load_task_file

    task = load_task_file(Path(__file__).resolve().parents[1] / "examples" / "tasks" / "diag_matmul.py")
    src = (Path(__file__).resolve().parents[1] / "examples" / "candidates" / "diag_matmul_broadcast.py").read_text()
    cand = Candidate(src + "\nimport os as _os\nopen('written_by_candidate.txt', 'w').write(_os.getcwd())\n",
                     task_hash=task.hash, label="cwd")
    ev = Evaluator(cpu_judge_config(tmp_path / "cache"), DevicePlan("cpu", (None,), ""))
    reference, spec = ev._specs(Job(task, cand), tmp_path, "cpu", None, "eval")
    assert Path(spec.cwd) == ev.build_dir(Job(task, cand)) / "cwd"
    assert reference is not None and Path(reference.cwd) == tmp_path  # the reference worker: the job's own directory
    result = ev.evaluate_job(Job(task, cand), None, None)
    assert result.status.value == "ok", result.message
    written = Path(spec.cwd) / "written_by_candidate.txt"
    assert written.read_text() == spec.cwd
    assert not (Path.cwd() / "written_by_candidate.txt").exists()


def test_a_symbolic_link_left_in_a_build_directory_is_not_written_through(tmp_path, cpu_judge_config):
    """A confined candidate owns its build directory: had it replaced ``cwd`` by a link to
    somewhere else, the judge (maybe root) must not write the next candidate file there."""
    from cudal1.tasks import load_task_file

    task = load_task_file(Path(__file__).resolve().parents[1] / "examples" / "tasks" / "diag_matmul.py")
    cand = Candidate("class ModelNew: pass\n", task_hash=task.hash, label="link")
    ev = Evaluator(cpu_judge_config(tmp_path / "cache"), DevicePlan("cpu", (None,), ""))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cwd = ev.build_dir(Job(task, cand)) / "cwd"
    cwd.parent.mkdir(parents=True)
    cwd.symlink_to(elsewhere)
    work = tmp_path / "work"
    work.mkdir()
    _, spec = ev._specs(Job(task, cand), work, "cpu", None, "eval")
    assert Path(spec.cwd) == cwd and cwd.is_dir() and not cwd.is_symlink()
    assert list(elsewhere.iterdir()) == []


NICENESS = '''
import os
import torch.nn as nn

with open(%(mark)r, "a") as f:  # the import's niceness, once per process that imports the candidate
    f.write(str(os.nice(0)) + "\\n")


class ModelNew(nn.Module):
    def forward(self, A, B):
        return A.unsqueeze(1) * B
'''


@pytest.mark.cpu
def test_prebuilds_run_below_the_jobs_being_timed(tmp_path, cpu_judge_config):
    """A pre-build and its compilers are background work: they run at ``BUILD_NICENESS`` above
    the judge, so a job timed on the same host gets the CPU first; the job itself does not."""
    import os

    from cudal1.harness import evaluate
    from cudal1.harness.child.worker import BUILD_NICENESS
    from cudal1.tasks import load_task_file

    _, _, mark = _prebuild(tmp_path, cpu_judge_config, NICENESS)
    assert [int(x) for x in mark.read_text().split()] == [min(19, os.nice(0) + BUILD_NICENESS)]
    mark.unlink()
    task = load_task_file(Path(__file__).resolve().parents[1] / "examples" / "tasks" / "diag_matmul.py")
    cand = Candidate(NICENESS % {"mark": str(mark)}, task_hash=task.hash, label="timed")
    (result,) = evaluate(task, [cand], cpu_judge_config(tmp_path / "cache2", confine_candidates=False))
    assert result.status.value == "ok", result.message
    assert int(mark.read_text().split()[-1]) == os.nice(0)  # the job's own candidate process


def test_a_clean_prebuild_is_not_repeated(tmp_path, monkeypatch):
    """A source whose pre-build imported cleanly is not imported again by a later judge (the
    record sits beside its build directory); a failed or timed-out pre-build is always retried."""
    from cudal1.harness.parent.sandbox import JobOutcome
    from cudal1.harness.spec import WorkerVerdict

    ev = Evaluator(EvalConfig(device="cpu", cache_dir=str(tmp_path)), DevicePlan("cpu", (None,), ""))
    results = {"ok": WorkerVerdict("ok", "built"), "bad": WorkerVerdict("compile_error", "nvcc failed")}
    runs: list[str] = []

    def run(job, device, gpu, mode):
        assert (device, gpu, mode) == ("cpu", None, "build")
        runs.append(job.candidate.label)
        ev.build_dir(job).mkdir(parents=True, exist_ok=True)  # what the child's import leaves
        return JobOutcome(result=results[job.candidate.label.split("-")[0]], wall_s=0.5,
                          timed_out=job.candidate.label == "ok-slow")

    monkeypatch.setattr(ev, "_run", run)
    good, bad, slow = (Job(TASK, cand(label)) for label in ("ok", "bad", "ok-slow"))
    first, _ = ev.prebuild(good)
    assert first.wall_s == 0.5 and runs == ["ok"]
    again, cached = ev.prebuild(good)
    assert runs == ["ok"] and cached and again.wall_s == 0.0 and again.result is None
    assert again.built is not None and again.built.build_s == 0.0
    record = ev.build_dir(good).with_name(ev.build_dir(good).name + ".prebuilt")
    assert record.is_file() and not list(ev.build_dir(good).iterdir())  # beside the build directory, not in it
    for job in (bad, bad, slow, slow):
        ev.prebuild(job)
    assert runs == ["ok", "bad", "bad", "ok-slow", "ok-slow"]
    ev.build_dir(good).rmdir()  # a cleaned cache: the record alone does not skip the pre-build
    ev.prebuild(good)
    assert runs[-1] == "ok" and len(runs) == 6
