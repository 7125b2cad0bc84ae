"""How optimize judges: several workers per GPU for compile-heavy builtin runs, and the judging
figures (GPU idle share) a run reports."""

from __future__ import annotations

import argparse

import pytest

from cudal1.cli.optimize import COMPILING_WORKERS_PER_GPU, default_workers_per_gpu
from cudal1.config import EvalConfig
from cudal1.harness.parent.batchstats import BatchStats
from cudal1.recorded import RecordedJudge
from cudal1.types import Task


class _Policy:
    def __init__(self, compiles: bool) -> None:
        self._compiles = compiles

    def compiles(self) -> bool:
        return self._compiles


def _args(workers: int | None = None, backend: str = "local") -> argparse.Namespace:
    return argparse.Namespace(workers_per_gpu=workers, backend=backend)


@pytest.mark.parametrize(("args", "device", "policy", "expected"), [
    (_args(), "cuda", _Policy(True), COMPILING_WORKERS_PER_GPU),  # compiles: one worker compiles, one is timed
    (_args(), "cuda", _Policy(False), None),  # nothing compiled: the config's value
    (_args(), "cpu", _Policy(True), None),  # no GPU to keep busy
    (_args(backend="ray"), "cuda", _Policy(True), None),  # Ray runs one timing actor per GPU
    (_args(3), "cuda", _Policy(True), 3),  # the flag wins
    (_args(1), "cuda", _Policy(True), 1),
    (_args(), "cuda", object(), None),  # an LLM policy has no compiles()
])
def test_compile_heavy_builtin_runs_default_to_two_workers_per_gpu(args, device, policy, expected):
    assert default_workers_per_gpu(args, device, policy) == expected


def test_the_builtin_policy_says_it_compiles_with_its_default_passes():
    from cudal1.policy.builtin import BuiltinPolicy

    assert BuiltinPolicy(device="cuda").compiles()
    assert not BuiltinPolicy(device="cuda", passes=["algebraic"]).compiles()


def _stats(jobs: int, span: float, busy: float) -> BatchStats:
    return BatchStats(
        jobs=jobs, wall_s=span, gpu_span_s=span, gpu_busy_s=busy, lane_busy_s=busy, lane_idle_s=span - busy
    )


def test_judging_summary_merges_every_batch_and_passes_stats_on(monkeypatch):
    judge = RecordedJudge(EvalConfig(device="cpu", workers_per_gpu=2))
    assert judge.judging_summary() is None  # nothing judged yet
    seen: list[BatchStats] = []
    forward = judge._stats_to(seen.append)
    forward(_stats(3, 10.0, 9.0))
    forward(_stats(1, 10.0, 5.0))
    assert len(seen) == 2 and judge.batch_stats == seen
    summary = judge.judging_summary()
    assert summary["batches"] == 2 and summary["jobs"] == 4 and summary["workers_per_gpu"] == 2
    assert summary["gpu_idle_share"] == pytest.approx(0.3)  # 6 of 20 GPU-seconds idle
    assert summary["wall_s"] == pytest.approx(20.0)


def test_baselines_hand_their_batch_stats_to_the_caller(monkeypatch):
    import cudal1.harness.parent.api as api

    stats = _stats(1, 4.0, 3.0)

    def fake_time_baselines(items, config, *, plan=None, on_result=None, on_stats=None):
        on_stats(stats)
        return [None for _ in items]

    class _Plan:
        device = "cpu"

    monkeypatch.setattr(api, "time_baselines", fake_time_baselines)
    monkeypatch.setattr(api, "environment_key", lambda plan: "env")
    judge = RecordedJudge(EvalConfig(device="cpu"), plan=_Plan())
    got: list[BatchStats] = []
    task = Task("t", "import torch\n")
    judge.baselines([task], ["eager"], on_stats=got.append)
    assert got == [stats] and judge.judging_summary()["jobs"] == 1


def test_an_identical_pair_settles_when_its_original_does(monkeypatch):
    """Progress and ETA see a copy of a pair (the same candidate proposed twice) settle the moment
    its original's verdict arrives, not at the end of the batch."""
    import cudal1.harness as harness
    from cudal1.config import EvalConfig
    from cudal1.recorded import RecordedJudge
    from cudal1.types import Candidate, EvalResult, Status, Task

    events: list[tuple[str, str]] = []

    def run_jobs(jobs, config, plan=None, on_result=None, on_stats=None):
        out = []
        for i, job in enumerate(jobs):
            res = EvalResult(status=Status.OK, task_hash=job.task.hash, candidate_hash=job.candidate.hash)
            on_result(i, res)
            events.append(("judged", job.candidate.source))
            out.append(res)
        return out

    monkeypatch.setattr(harness, "run_jobs", run_jobs)
    task = Task("t", "class Model: pass\n")
    a, b = Candidate("A = 1\n", task_hash=task.hash), Candidate("B = 2\n", task_hash=task.hash)
    judge = RecordedJudge(EvalConfig(device="cpu"), on_event=lambda e: events.append((e.kind, e.result.candidate_hash)))
    results = judge.judge([(task, a), (task, a), (task, b)])
    assert [r.candidate_hash for r in results] == [a.hash, a.hash, b.hash]
    assert events[:3] == [("verdict", a.hash), ("recorded", a.hash), ("judged", "A = 1\n")]


def test_jobs_along_share_the_pairs_batch_and_go_to_their_own_callback(monkeypatch):
    """``judge(along=...)``: the extra jobs run in the pairs' batch, after them in its list; each
    result goes to the caller's callback, not to the store nor the returned verdicts; they run
    even when every pair was recorded already."""
    import cudal1.harness as harness
    from cudal1.harness import Job
    from cudal1.types import Candidate, EvalResult, Status

    batches: list[list[str]] = []

    def run_jobs(jobs, config, plan=None, on_result=None, on_stats=None):
        batches.append([job.label for job in jobs])
        out = []
        for i, job in enumerate(jobs):
            res = EvalResult(status=Status.OK, task_hash=job.task.hash,
                             candidate_hash=job.candidate.hash if job.candidate else f"baseline:{job.baseline_mode}")
            on_result(i, res)
            out.append(res)
        return out

    monkeypatch.setattr(harness, "run_jobs", run_jobs)
    task = Task("t", "class Model: pass\n")
    a = Candidate("A = 1\n", task_hash=task.hash, label="a")
    judge = RecordedJudge(EvalConfig(device="cpu"))
    kept: list[str] = []
    along = ([Job(task, None, "compile-max-autotune-no-cudagraphs"), Job(task, None, "cudagraph")],
             lambda res: kept.append(res.candidate_hash))
    results = judge.judge([(task, a)], along=along)
    assert batches == [["a", "compile-max-autotune-no-cudagraphs", "cudagraph"]]
    assert [r.candidate_hash for r in results] == [a.hash] and judge.judged == 1
    assert kept == ["baseline:compile-max-autotune-no-cudagraphs", "baseline:cudagraph"]
    judge.judge([(task, a)], along=([Job(task, None, "cudagraph")], kept.append))  # a's verdict is recorded
    assert batches[-1] == ["cudagraph"] and len(kept) == 3 and judge.judged == 1
    judge.judge([(task, a)])
    assert len(batches) == 2  # nothing to judge, nothing along: no batch


def _verdict(task: Task, cand, config: EvalConfig, speedup: float = 2.0):
    from cudal1.types import EvalResult, Status

    return EvalResult(status=Status.OK, task_name=task.name, task_hash=task.hash, candidate_hash=cand.hash,
                      config_hash=config.hash(), speedup=speedup)


def test_an_outside_verdict_enters_the_store_only_through_adopt(tmp_path):
    """Another run's verdict under the same judge config is adopted (recorded, read back, never
    judged again); one under another config, for another candidate, or where this run has its own
    is not."""
    from cudal1.store import RunStore
    from cudal1.types import Candidate

    config = EvalConfig(device="cpu")
    task = Task(name="t", source="class Model: pass\n")
    cand, other = Candidate("class ModelNew: pass\n", task_hash=task.hash), Candidate("x = 1\n", task_hash=task.hash)
    judge = RecordedJudge(config)
    with judge.store_at(tmp_path / "run.sqlite") as store:
        assert not judge.adopt(task, cand, _verdict(task, cand, EvalConfig(device="cpu", correctness_trials=9)))
        assert not judge.adopt(task, cand, _verdict(task, other, config))
        assert judge.adopt(task, cand, _verdict(task, cand, config))
        assert not judge.adopt(task, cand, _verdict(task, cand, config, 3.0))  # this run has one already
        assert judge.judge([(task, cand)])[0].speedup == 2.0 and judge.judged == 0
        assert [c.hash for c in store.candidates(task.hash)] == [cand.hash]
    assert judge.store is None  # store_at closes what it opened
    with RunStore(tmp_path / "run.sqlite") as store:
        assert store.get_evaluation(task.hash, cand.hash, config.hash()).speedup == 2.0


def test_a_given_store_stays_open_and_runs_are_recorded_with_their_status(tmp_path):
    from cudal1.store import RunStore

    with RunStore(tmp_path / "run.sqlite") as store:
        judge = RecordedJudge(EvalConfig(device="cpu"), store)
        with judge.store_at(tmp_path / "elsewhere.sqlite") as used:
            assert used is store
        assert judge.store is store and not (tmp_path / "elsewhere.sqlite").exists()
        with judge.run("optimize", {"n": 1}):
            pass
        with pytest.raises(KeyboardInterrupt), judge.run("optimize", {"n": 2}):
            raise KeyboardInterrupt
        with judge.run("optimize", {"n": 3}, record=False):
            pass
        assert [store.get_run(i)["status"] for i in (1, 2)] == ["done", "interrupted"] and store.get_run(3) is None


def test_a_resumed_judge_schedules_by_the_stores_recorded_footprints(tmp_path, monkeypatch):
    """Before judging, the store's verdicts under this config seed the batches' hints, once: job
    seconds, a task's GPU memory, and that it ran out of memory beside others."""
    from cudal1.harness.parent import gpu_memory, task_seconds
    from cudal1.store import RunStore
    from cudal1.types import Candidate

    seconds, memory = task_seconds.TaskSeconds(), gpu_memory.TaskMemory()
    monkeypatch.setattr(task_seconds, "TASK_SECONDS", seconds)
    monkeypatch.setattr(gpu_memory, "TASK_MEMORY", memory)
    config = EvalConfig(device="cpu")
    task = Task(name="t", source="class Model: pass\n")
    cand = Candidate("class ModelNew: pass\n", task_hash=task.hash)
    with RunStore(tmp_path / "run.sqlite") as store:
        earlier = _verdict(task, cand, config)
        earlier.wall_s, earlier.figures, earlier.flags = 42.0, {"gpu_memory_mib": 50000}, ["rejudged_alone"]
        store.record_evaluation(earlier)
        judge = RecordedJudge(config, store)
        assert judge.prime_batches() == 1 and judge.prime_batches() == 0  # once per judge
        assert seconds.get(task.hash) == 42.0
        assert memory.bound(task.hash) and memory.need(task.hash) >= 50000
        assert RecordedJudge(config.replace(correctness_trials=9), store).prime_batches() == 0  # another judge


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_a_resumed_judge_knows_a_reference_that_blocked_alone_and_no_memory_bound_task(tmp_path, monkeypatch, side):
    """A stored verdict judged again alone for calls blocked beside other jobs, whose reference's
    calls were blocked in that verdict too, tells a fresh machine that the task's reference blocks
    by itself (its later verdicts are not judged again for it); a candidate blocked alone says
    nothing of the task.  Neither makes the task one that ran out of memory."""
    from cudal1.harness.parent import gpu_memory
    from cudal1.store import RunStore
    from cudal1.types import Candidate

    memory = gpu_memory.TaskMemory()
    monkeypatch.setattr(gpu_memory, "TASK_MEMORY", memory)
    config = EvalConfig(device="cpu")
    task = Task(name="t", source="class Model: pass\n")
    with RunStore(tmp_path / "run.sqlite") as store:
        earlier = _verdict(task, Candidate("class ModelNew: pass\n", task_hash=task.hash), config)
        earlier.wall_s, earlier.flags = 6.0, ["rejudged_alone"]
        earlier.figures = {"gpu_memory_mib": 6000,
                           "blocked_calls": {"calls": {"candidate": 14, "reference": 14}, "candidate": 0, side: 14},
                           "rejudged_alone": {"because": f"the {side}'s timed calls were blocked beside other jobs"}}
        store.record_evaluation(earlier)
        assert RecordedJudge(config, store).prime_batches() == 1
    assert memory.reference_blocks(task.hash) is (side == "reference")
    assert not memory.bound(task.hash)
