"""Tests for cudal1.store.RunStore (fast, CPU only, no torch)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

from cudal1.store import SCHEMA_VERSION, RunStore, StoreError
from cudal1.types import (
    Candidate,
    Correctness,
    Environment,
    EvalResult,
    Status,
    Task,
    Timing,
)

TASK_SRC = "import torch\nclass Model(torch.nn.Module):\n    pass\n"


def make_result(
    cand: str = "c1",
    task: str = "t1",
    config: str = "cfg",
    status: Status = Status.OK,
    speedup: float | None = 1.5,
    env: Environment | None = None,
) -> EvalResult:
    ref = Timing.from_samples([2.0, 2.1, 1.9, 2.05], clock="cuda_event")
    new = Timing.from_samples([1.0, 1.1, 0.9], clock="cuda_event")
    return EvalResult(
        status=status,
        task_name="19_ReLU",
        task_hash=task,
        candidate_hash=cand,
        message="fine",
        flags=["a", "b"],
        correctness=Correctness(trials=5, passed=5, max_abs_error=1e-6, max_rel_error=2e-6),
        reference=ref,
        candidate=new,
        speedup=speedup,
        speedup_ci=(1.25, 1.75) if speedup is not None else None,
        compile_log="log",
        stderr_tail="tail",
        phase="done",
        environment=env or Environment(device="cuda", gpu_name="H200", torch="2.5", cuda="12.4"),
        config_hash=config,
        wall_s=3.25,
        build_s=1.5,
    )


@pytest.fixture
def store(tmp_path):
    with RunStore(tmp_path / "sub" / "dir" / "runs.db") as s:
        yield s


def test_creates_parent_dirs_and_wal(tmp_path):
    path = tmp_path / "a" / "b" / "runs.db"
    with RunStore(path) as s:
        assert path.exists()
        assert s._journal_mode() == "wal"
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert row[0] == str(SCHEMA_VERSION)
    finally:
        conn.close()


def test_evaluation_round_trip(store):
    r = make_result()
    store.record_evaluation(r)
    back = store.get_evaluation("t1", "c1", "cfg")
    assert back == r
    assert isinstance(back.speedup_ci, tuple) and back.speedup_ci == (1.25, 1.75)
    assert isinstance(back.candidate, Timing) and back.candidate.samples_ms == [1.0, 1.1, 0.9]
    assert back.status is Status.OK
    assert store.get_evaluation("t1", "c1", "other") is None
    env = store.get_environment(r.environment.key())
    assert env is not None and env["gpu_name"] == "H200"
    assert store.environments() == [env]  # every environment recorded: the one


def test_upsert_replaces_and_keeps_id(store):
    first = store.record_evaluation(make_result(status=Status.INCORRECT, speedup=None))
    second = store.record_evaluation(make_result(status=Status.OK, speedup=2.0))
    assert first == second
    evs = store.evaluations()
    assert len(evs) == 1
    assert evs[0].status is Status.OK and evs[0].speedup == 2.0
    assert store.counts() == {"ok": 1}


def test_resume_semantics(tmp_path):
    path = tmp_path / "runs.db"
    with RunStore(path) as s:
        s.record_evaluation(make_result(cand="c1"))
        assert s.has_evaluation("t1", "c1", "cfg")
        assert not s.has_evaluation("t1", "c2", "cfg")
    with RunStore(path) as s:  # a new process resuming the same file
        assert s.has_evaluation("t1", "c1", "cfg")
        assert not s.has_evaluation("t1", "c1", "cfg-changed")  # new config => re-evaluate
        assert not s.has_evaluation("t2", "c1", "cfg")


def test_record_evaluation_requires_identity(store):
    with pytest.raises(ValueError):
        store.record_evaluation(make_result(cand=""))


def test_baselines_keyed_by_env(store):
    env_a = Environment(device="cuda", gpu_name="H200", torch="2.5", cuda="12.4")
    env_b = Environment(device="cuda", gpu_name="A100", torch="2.5", cuda="12.4")
    ra = make_result(env=env_a, speedup=None)
    rb = make_result(env=env_b, speedup=None)
    store.record_baseline("t1", "eager", env_a.key(), "cfg", ra)
    store.record_baseline("t1", "eager", env_b.key(), "cfg", rb)
    assert store.get_baseline("t1", "eager", env_a.key(), "cfg").environment.gpu_name == "H200"
    assert store.get_baseline("t1", "eager", env_b.key(), "cfg").environment.gpu_name == "A100"
    assert store.get_baseline("t1", "compile", env_a.key(), "cfg") is None
    assert store.get_baseline("t1", "eager", env_a.key(), "cfg2") is None
    # upsert
    ra2 = make_result(env=env_a, speedup=None)
    ra2.message = "remeasured"
    store.record_baseline("t1", "eager", env_a.key(), "cfg", ra2)
    assert store.get_baseline("t1", "eager", env_a.key(), "cfg").message == "remeasured"


def test_verdict_spans_are_each_verdicts_wall_before_its_recording_under_one_config(store, monkeypatch):
    import cudal1.store as store_module

    clock = iter([100.0, 104.0, 110.0])
    monkeypatch.setattr(store_module.time, "time", lambda: next(clock))
    store.record_evaluation(make_result(cand="c1"))  # wall_s 3.25, recorded at 100
    store.record_evaluation(make_result(cand="c2", config="other"))  # another judge: not its spans
    env = Environment(device="cuda", gpu_name="H200", torch="2.5", cuda="12.4")
    baseline = make_result(cand="baseline:cudagraph", env=env, speedup=None)
    baseline.wall_s = 2.0
    store.record_baseline("t1", "cudagraph", env.key(), "cfg", baseline)  # recorded at 110
    assert store.verdict_spans("cfg") == [(96.75, 100.0, "t1", "candidate", False),
                                          (108.0, 110.0, "t1", "cudagraph", False)]
    assert store.verdict_spans("none") == []


def test_recorded_jobs_are_each_verdicts_and_baselines_footprint_under_one_config(store):
    from cudal1.store import RecordedJob

    store.record_evaluation(make_result(cand="c1"))  # wall_s 3.25, no memory figure
    store.record_evaluation(make_result(cand="c2", config="other"))  # another judge: not its jobs
    unmeasured = make_result(cand="c3")
    unmeasured.wall_s = 0.0
    store.record_evaluation(unmeasured)  # neither wall time nor memory: left out
    env = Environment(device="cuda", gpu_name="H200", torch="2.5", cuda="12.4")
    baseline = make_result(cand="baseline:cudagraph", env=env, speedup=None)
    baseline.wall_s, baseline.figures, baseline.flags = 2.0, {"gpu_memory_mib": 70000}, ["rejudged_alone"]
    store.record_baseline("t1", "cudagraph", env.key(), "cfg", baseline)
    assert sorted(store.recorded_jobs("cfg"), key=lambda j: j.kind) == [
        RecordedJob("t1", "candidate", 3.25, 0, False), RecordedJob("t1", "cudagraph", 2.0, 70000, True)]
    assert store.recorded_jobs("none") == []


def test_a_recorded_job_says_it_was_judged_again_for_blocked_calls_and_what_blocked(store):
    """A verdict judged again alone because its timed calls were blocked beside other jobs keeps
    that reason and the blocked counts of the verdict that stands; a failed verdict's counts are
    not read."""
    counts = {"calls": {"candidate": 10, "reference": 10}, "candidate": 0, "reference": 10}
    blocked = make_result(cand="c1")
    blocked.flags = ["rejudged_alone"]
    blocked.figures = {"blocked_calls": counts, "rejudged_alone": {"because": "the reference's timed calls were "
                                                                   "blocked beside other jobs", "speedup": 0.4}}
    store.record_evaluation(blocked)
    failed = make_result(cand="c2", status=Status.RUNTIME_ERROR, speedup=None)
    failed.figures = {"blocked_calls": counts}
    store.record_evaluation(failed)
    jobs = {j.rejudged_alone: j for j in store.recorded_jobs("cfg")}
    assert jobs[True].rejudged_for_blocked_calls and jobs[True].blocked_calls == counts
    assert not jobs[False].rejudged_for_blocked_calls and jobs[False].blocked_calls is None


def test_best_and_counts(store):
    store.record_evaluation(make_result(cand="a", speedup=1.2))
    store.record_evaluation(make_result(cand="b", speedup=3.0))
    store.record_evaluation(make_result(cand="c", speedup=9.0, status=Status.INCORRECT))
    store.record_evaluation(make_result(cand="d", speedup=None, status=Status.COMPILE_ERROR))
    store.record_evaluation(make_result(cand="e", speedup=None))  # ok but no speedup
    store.record_evaluation(make_result(cand="f", speedup=100.0, task="t2"))
    best = store.best("t1")
    assert best is not None and best.candidate_hash == "b" and best.speedup == 3.0
    assert store.best("t2").candidate_hash == "f"
    assert store.best("nope") is None
    assert store.counts("t1") == {"ok": 3, "incorrect": 1, "compile_error": 1}
    assert store.counts() == {"ok": 4, "incorrect": 1, "compile_error": 1}
    assert [r.candidate_hash for r in store.evaluations("t1", Status.OK)] == ["a", "b", "e"]
    assert [r.candidate_hash for r in store.evaluations(status="incorrect")] == ["c"]
    assert len(store.evaluations()) == 6


def test_take_verdicts_removes_one_task_under_one_config_and_returns_the_rows(store):
    env = Environment(device="cuda", gpu_name="H200", torch="2.5", cuda="12.4")
    store.record_evaluation(make_result(cand="a", status=Status.REJECTED, speedup=None))
    store.record_evaluation(make_result(cand="b", speedup=1.2))
    store.record_evaluation(make_result(cand="a", config="old"))  # another configuration: kept
    store.record_evaluation(make_result(cand="a", task="t2"))  # another task: kept
    store.record_baseline("t1", "compile-default", env.key(), "cfg", make_result(speedup=0.6))
    store.record_baseline("t1", "compile-default", env.key(), "old", make_result(speedup=0.5))
    taken = store.take_verdicts("t1", "cfg")
    assert [(r["candidate_hash"], r["status"]) for r in taken["evaluations"]] == [("a", "rejected"), ("b", "ok")]
    assert taken["evaluations"][1]["result"]["speedup"] == 1.2 and taken["evaluations"][1]["speedup"] == 1.2
    assert [(r["mode"], r["result"]["speedup"]) for r in taken["baselines"]] == [("compile-default", 0.6)]
    assert store.evaluations("t1") == [store.get_evaluation("t1", "a", "old")] and len(store.evaluations("t2")) == 1
    assert store.get_baseline("t1", "compile-default", env.key(), "cfg") is None
    assert store.get_baseline("t1", "compile-default", env.key(), "old").speedup == 0.5
    assert store.take_verdicts("t1", "cfg") == {"evaluations": [], "baselines": []}
    store.record_evaluation(make_result(cand="c", task="t2", config="cfg"))

    def fails(rows):
        raise OSError("disk full")

    with pytest.raises(OSError):  # the rows could not be kept elsewhere: nothing is deleted
        store.take_verdicts("t2", "cfg", keep=fails)
    assert store.get_evaluation("t2", "c", "cfg") is not None
    store.record_evaluation(make_result(cand="a", status=Status.OK))  # judged again under the same key
    assert store.get_evaluation("t1", "a", "cfg").status is Status.OK


def test_tasks_candidates_and_runs(store):
    task = Task(name="19_ReLU", source=TASK_SRC, level=1, problem_id=19, origin="suite")
    assert store.add_task(task) == task.hash
    store.add_task(task)  # idempotent
    assert store.get_task(task.hash) == task
    assert store.get_task("missing") is None
    cand = Candidate(source="class ModelNew: pass", label="policy")
    store.add_candidate(cand, task.hash, meta={"step": 3})
    store.add_candidate(cand, "other-task")  # same source, another task
    store.add_candidate(cand, task.hash)  # idempotent
    assert [c.hash for c in store.candidates(task.hash)] == [cand.hash]
    assert store.candidates("other-task")[0].task_hash == "other-task"

    run_id = store.start_run("eval", {"trials": 5})
    run = store.get_run(run_id)
    assert run["status"] == "running" and run["finished_at"] is None
    assert run["config"] == {"trials": 5}
    store.finish_run(run_id, "done")
    run = store.get_run(run_id)
    assert run["status"] == "done" and run["finished_at"] is not None
    with pytest.raises(StoreError):
        store.finish_run(run_id + 100, "done")


def test_unknown_schema_version(tmp_path):
    path = tmp_path / "runs.db"
    RunStore(path).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                     (str(SCHEMA_VERSION + 1),))
    conn.close()
    with pytest.raises(StoreError) as info:
        RunStore(path)
    assert "schema version" in str(info.value)
    assert "\n" not in str(info.value)


def test_not_a_database(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        RunStore(path)


def test_concurrent_threads(store):
    def work(k: int) -> None:
        for i in range(25):
            store.record_evaluation(make_result(cand=f"c{k}-{i}"))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.counts() == {"ok": 100}


@pytest.mark.cpu
def test_import_does_not_pull_torch():
    code = "import sys, cudal1.store; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.cpu
def test_sigkill_loses_nothing_recorded(tmp_path):
    path = tmp_path / "crash.db"
    n = 20
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        from cudal1.store import RunStore
        from cudal1.types import EvalResult, Status
        store = RunStore({str(path)!r})
        store.start_run("eval", {{"n": {n}}})
        for i in range({n}):
            store.record_evaluation(EvalResult(status=Status.OK, task_hash="t",
                                               candidate_hash=f"c{{i}}", speedup=float(i)))
        sys.stdout.write("recorded\\n"); sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "recorded" in proc.stdout
    with RunStore(path) as s:
        assert s.counts() == {"ok": n}
        assert {r.candidate_hash for r in s.evaluations("t")} == {f"c{i}" for i in range(n)}
        assert s.best("t").speedup == float(n - 1)
        assert s.get_run(1)["status"] == "running"  # never finished: visible as such
