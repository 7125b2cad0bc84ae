"""The local scheduler (CPU tier): lanes take ready work first and never wait on a build that has
not started, builds start at once (bounded by the build budget, not by lanes), batch stats add
up; with a stand-in Evaluator (no worker processes), then once through the real judge and the
``judge-suite`` summary."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli_support import SMALL_DIAG
from cudal1.config import EvalConfig
from cudal1.harness.parent import batch, gpu_memory, task_seconds
from cudal1.harness.parent.api import DevicePlan, Job, run_jobs
from cudal1.types import Candidate, EvalResult, Status, Task

REPO = Path(__file__).resolve().parents[1]
TASK = Task(name="t", source="import torch\nclass Model(torch.nn.Module):\n    pass\n")
BUILD_S, JUDGE_S = 0.6, 0.15
REAL_EVALUATOR = batch.Evaluator


def job(tag: str, builds: bool) -> Job:
    head = "from torch.utils.cpp_extension import load_inline\n" if builds else "import torch\n"
    return Job(TASK, Candidate(head + f"# {tag}\n", task_hash=TASK.hash, label=tag))


@dataclass
class Outcome:
    wall_s: float = BUILD_S
    built: object = None
    timed_out: bool = False


class FakeEvaluator:
    """Stands in for batch.Evaluator: builds sleep, judging sleeps, both are logged."""

    log: list[tuple[str, str, float]] = []  # (event, label, time)
    lock = threading.Lock()

    def __init__(self, config: EvalConfig, plan: DevicePlan, *, max_jobs: int | None = None, input_seed=None) -> None:
        self.real = REAL_EVALUATOR(config, plan, max_jobs=max_jobs)

    def build_dir(self, j: Job) -> Path:
        return self.real.build_dir(j)

    def note(self, event: str, label: str) -> None:
        with self.lock:
            self.log.append((event, label, time.monotonic()))

    def prebuild(self, j: Job):
        self.note("build_start", j.label)
        time.sleep(BUILD_S)
        self.note("build_end", j.label)
        return Outcome(), False

    def evaluate_job(self, j: Job, gpu, prebuilt) -> EvalResult:
        self.note("judge_start", j.label)
        time.sleep(JUDGE_S)
        return EvalResult(
            status=Status.OK, task_name=j.task.name, task_hash=j.task.hash, candidate_hash=j.candidate.hash
        )

    def close(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch):
    FakeEvaluator.log = []
    monkeypatch.setattr(batch, "Evaluator", FakeEvaluator)
    return FakeEvaluator


def config(tmp_path: Path, workers: int) -> EvalConfig:
    return EvalConfig(device="cpu", cache_dir=str(tmp_path), build_workers=workers)


def times(log, event):
    return {label: t for e, label, t in log if e == event}


def test_lane_takes_ready_work_first_and_never_waits_on_a_queued_build(fake, tmp_path):
    jobs = [job("b1", True), job("b2", True), job("b3", True), job("p1", False), job("p2", False)]
    stats = []
    results = run_jobs(jobs, config(tmp_path, 1), plan=DevicePlan("cpu", (None,), ""), on_stats=stats.append)
    assert [r.candidate_hash for r in results] == [j.candidate.hash for j in jobs]  # job order kept
    order = [label for e, label, _ in fake.log if e == "judge_start"]
    assert order[:2] == ["p1", "p2"], order  # ready work first, although submitted last
    built, judged = times(fake.log, "build_end"), times(fake.log, "judge_start")
    for label in ("b1", "b2", "b3"):
        assert judged[label] >= built[label], f"{label} judged before its build finished"
    starts = times(fake.log, "build_start")
    assert starts["b1"] < starts["b2"] < starts["b3"]  # one build process (build_workers=1): in order
    s = stats[0]
    assert s.max_concurrent_builds == 1
    assert s.per_job[1].build_queue_s >= BUILD_S * 0.9  # b2 waited for b1 (a sleep never ends early)
    assert judged["p1"] < built["b1"]  # the lane started on ready work while the first build still ran


class _Timed:
    """Fresh tasks no other test judged in this process, a stand-in judge whose ``long`` task's jobs
    sleep ``long_s`` (the others 0.05 s), and jobs made of (task, label) pairs."""

    def __init__(self, monkeypatch, long_s: float, names=("short", "long", "fresh")) -> None:
        import uuid

        self.tag = uuid.uuid4().hex
        self.tasks = {n: Task(name=f"{n}_{self.tag}", source=f"import torch\n# {n} {self.tag}\n") for n in names}
        long = self.tasks["long"]

        def evaluate_job(judge, j: Job, gpu, prebuilt) -> EvalResult:
            judge.note("judge_start", j.label)
            time.sleep(long_s if j.task is long else 0.05)
            return EvalResult(status=Status.OK, task_name=j.task.name, task_hash=j.task.hash,
                              candidate_hash=j.candidate.hash)

        monkeypatch.setattr(FakeEvaluator, "evaluate_job", evaluate_job)

    def jobs(self, *spec: tuple[str, str]) -> list[Job]:
        return [Job(self.tasks[n], Candidate(f"import torch\n# {label} {self.tag}\n", task_hash=self.tasks[n].hash,
                                             label=label)) for n, label in spec]


def test_a_lane_takes_the_job_whose_task_took_longest_first(fake, tmp_path, monkeypatch):
    """Among ready jobs, the one whose task's longest job so far in this process took longest
    starts first; tasks not judged yet start before known ones, in the batch's order; results
    keep the batch's order."""
    timed = _Timed(monkeypatch, long_s=0.4)
    plan = DevicePlan("cpu", (None,), "")
    run_jobs(timed.jobs(("short", "s0"), ("long", "l0")), config(tmp_path, 1), plan=plan)  # unknown: in order
    assert [label for e, label, _ in fake.log if e == "judge_start"] == ["s0", "l0"]
    fake.log.clear()
    later = timed.jobs(("short", "s1"), ("short", "s2"), ("long", "l1"), ("fresh", "f1"))
    results = run_jobs(later, config(tmp_path, 1), plan=plan)
    assert [label for e, label, _ in fake.log if e == "judge_start"] == ["f1", "l1", "s1", "s2"]
    assert [r.candidate_hash for r in results] == [j.candidate.hash for j in later]
    seconds = task_seconds.TASK_SECONDS
    assert seconds.get(timed.tasks["long"].hash) >= 0.4 > seconds.get(timed.tasks["short"].hash)


def test_a_drain_lets_running_jobs_finish_and_starts_no_other(fake, tmp_path):
    """Requested as the first verdict arrives: the other lane's running job finishes and is
    handed over, nothing else starts, and the batch raises Drained (a KeyboardInterrupt)."""
    from cudal1.harness.parent import drain

    jobs = [job(f"p{i}", False) for i in range(6)]
    got: list[int] = []

    def on_result(i: int, r: EvalResult) -> None:
        got.append(i)
        drain.request()

    try:
        with pytest.raises(drain.Drained, match=r"drained: \d job\(s\) not started") as raised:
            run_jobs(jobs, config(tmp_path, 1).replace(workers_per_gpu=2), plan=DevicePlan("cpu", (None,), ""),
                     on_result=on_result)
        assert isinstance(raised.value, KeyboardInterrupt)  # stops whatever stops on Ctrl-C
        assert raised.value.stats is not None and raised.value.stats.wall_s > 0  # the stats of what it ran
        started = sorted(label for e, label, _ in fake.log if e == "judge_start")
        assert started == [f"p{i}" for i in sorted(got)]  # every job started was judged and handed over
        assert sorted(got) == list(range(len(got))) and len(got) <= 3  # the lanes' jobs when it came, no more
        with pytest.raises(drain.Drained):  # the drain lasts: a later batch starts nothing
            run_jobs(jobs[2:], config(tmp_path, 1), plan=DevicePlan("cpu", (None,), ""))
    finally:
        drain.clear()
    assert len(run_jobs(jobs[2:], config(tmp_path, 1), plan=DevicePlan("cpu", (None,), ""))) == 4


def test_a_drain_window_still_starts_the_jobs_that_fit_in_its_time_left(fake, tmp_path, monkeypatch):
    """``drain.after(s, end=E)``: from s on, a lane starts only a job whose task's longest job so
    far (x FIT_FACTOR + FIT_SLACK_S) fits before E, and never one of a task not judged yet; at E,
    nothing; the jobs left unstarted raise Drained.  ``admits`` without a drain: always."""
    from cudal1.harness.parent import drain

    timed = _Timed(monkeypatch, long_s=1.5)
    monkeypatch.setattr(drain, "FIT_SLACK_S", 0.1)
    monkeypatch.setattr(drain, "START_SHARE", 0.0)  # no early start for a job too long for the window
    plan = DevicePlan("cpu", (None,), "")
    assert drain.admits(float("inf"))
    run_jobs(timed.jobs(("short", "s0"), ("long", "l0")), config(tmp_path, 1), plan=plan)
    fake.log.clear()
    try:
        drain.after(0.0, end=2.0)  # long: 1.5 x 1.5 + 0.1 s never fits; short: 0.175 s does, for a while
        for _ in range(100):  # the window opens on a timer thread
            if drain.requested():
                break
            time.sleep(0.005)
        assert drain.requested() and drain.admits(0.05) and not drain.admits(1.5) and not drain.admits(float("inf"))
        with pytest.raises(drain.Drained):
            run_jobs(timed.jobs(("long", "l1"), ("fresh", "f1"), *[("short", f"s{i}") for i in range(1, 200)]),
                     config(tmp_path, 1), plan=plan)
        started = [label for e, label, _ in fake.log if e == "judge_start"]
        assert started and all(label.startswith("s") for label in started), started
        time.sleep(2.0)
        assert not drain.admits(0.0)  # the window is over: nothing starts
    finally:
        drain.clear()
    assert drain.admits(1.5)


def test_a_deadline_starts_no_job_that_cannot_end_before_it_and_drains_once_none_can(fake, tmp_path, monkeypatch):
    """``drain.after(s, end=E)`` bounds every start by E at once, before the drain at s: a job
    whose task's jobs of its kind took too long never starts, nor one of a fresh task sized by the
    upper quartile of its kind (of two tasks: the longer); once nothing pending fits, the batch
    drains itself well before s."""
    from cudal1.harness.parent import drain

    monkeypatch.setattr(task_seconds, "TASK_SECONDS", task_seconds.TaskSeconds())  # other tests' tasks left out
    timed = _Timed(monkeypatch, long_s=1.5)
    monkeypatch.setattr(drain, "FIT_SLACK_S", 0.1)
    monkeypatch.setattr(drain, "START_SHARE", 0.0)  # no early start for a job too long for the window
    plan = DevicePlan("cpu", (None,), "")
    run_jobs(timed.jobs(("short", "s0"), ("long", "l0")), config(tmp_path, 1), plan=plan)
    fake.log.clear()
    try:
        timer = drain.after(1.9, end=2.0)  # long: 1.5 x 1.5 + 0.1 s > 2 s; fresh: sized by long's 1.5 s
        t0 = time.monotonic()
        with pytest.raises(drain.Drained, match=r"drained: 2 job\(s\) not started"):
            run_jobs(timed.jobs(("long", "l1"), ("fresh", "f1"), *[("short", f"s{i}") for i in range(1, 6)]),
                     config(tmp_path, 1), plan=plan)
        assert time.monotonic() - t0 < 1.9 and drain.requested()  # drained by the batch, not by the timer
        assert sorted(label for e, label, _ in fake.log if e == "judge_start") == [f"s{i}" for i in range(1, 6)]
        timer.cancel()
    finally:
        drain.clear()


def test_task_seconds_size_a_job_by_its_own_kind(monkeypatch):
    """A baseline mode is sized by that mode's jobs of its task, never by the task's candidates;
    without one, by its kind's upper quartile over tasks, else the tasks' longest jobs' upper
    quartile, else not at all (infinite)."""
    timed = _Timed(monkeypatch, long_s=0.0)
    seconds = task_seconds.TaskSeconds()
    cand = timed.jobs(("short", "c"))[0]
    mode_a, mode_b = (Job(timed.tasks[n], None, "compile-max-autotune") for n in ("short", "fresh"))
    assert seconds.stand_in(cand) == seconds.expected(cand) == float("inf")
    seconds.note(cand, 2.0)
    assert seconds.expected(cand) == 2.0 and seconds.expected(mode_a) == float("inf")
    assert seconds.stand_in(mode_a) == 2.0  # no baseline judged yet: the tasks' longest jobs
    seconds.note(mode_b, 9.0)
    seconds.note(mode_b, 7.0)
    assert seconds.expected(mode_b) == 9.0 and seconds.stand_in(mode_a) == 9.0 and seconds.stand_in(cand) == 2.0
    assert seconds.get(timed.tasks["short"].hash) == 2.0 and seconds.get(timed.tasks["fresh"].hash) == 9.0


def test_task_seconds_seeded_from_an_earlier_process_size_a_jobs_first_kind_by_its_task(monkeypatch):
    """A seeded time counts as one judged here; a job of a kind its task never ran is sized by the
    longest of that kind anywhere, but never below its own task's longest job."""
    timed = _Timed(monkeypatch, long_s=0.0)
    seconds = task_seconds.TaskSeconds()
    big, small = timed.tasks["long"], timed.tasks["short"]
    seconds.seed(small.hash, "compile-max-autotune", 20.0)
    seconds.seed(big.hash, "candidate", 100.0)
    big_mode, small_cand = Job(big, None, "compile-max-autotune"), timed.jobs(("short", "c"))[0]
    assert seconds.expected(big_mode) == float("inf") and seconds.stand_in(big_mode) == 100.0
    assert seconds.expected(Job(small, None, "compile-max-autotune")) == 20.0
    assert seconds.stand_in(small_cand) == 100.0  # no candidate of it yet: the longest candidate anywhere
    assert seconds.get(big.hash) == 100.0 > seconds.get(small.hash) == 20.0  # the big task starts first


def test_one_tasks_outlier_does_not_size_every_other_tasks_first_job_of_its_kind(monkeypatch):
    """The stand-in is the kind's upper quartile over tasks (nearest rank), not its longest: one
    task's 490 s baseline among 50 s ones leaves a fresh task's job sized at 50 s, so a 545 s
    call can still start it; its own task's longest job still bounds it from below."""
    from cudal1.types import Task

    timed = _Timed(monkeypatch, long_s=0.0)
    seconds = task_seconds.TaskSeconds()
    mode = "compile-max-autotune-no-cudagraphs"
    judged = [Task(name=f"t{i}", source=f"# t{i}\n") for i in range(8)]
    for i, task in enumerate(judged):
        seconds.seed(task.hash, mode, 490.0 if i == 0 else 20.0 + 5 * i)  # 25..55 s, and one outlier
    fresh, big = timed.tasks["fresh"], timed.tasks["long"]
    assert seconds.stand_in(Job(fresh, None, mode)) == 50.0  # the 6th of 8 sorted: 25 30 35 40 45 50 55 490
    seconds.seed(big.hash, "candidate", 120.0)
    assert seconds.stand_in(Job(big, None, mode)) == 120.0  # its own search verdicts are longer
    assert seconds.expected(Job(judged[0], None, mode)) == 490.0  # a task's own time stays its own


def test_one_tasks_outlier_does_not_size_every_job_of_a_kind_no_task_ran_yet():
    """A kind no task ran yet (CUDA-graph replay after every compiled baseline) is sized by the
    upper quartile of the tasks' longest jobs, not by the single longest: one level-3 model's 353 s
    baseline among 10-60 s tasks leaves a fresh kind's job of a small task sized at the small
    tasks' figure (a 420 s call starts it), while that model's own job stays sized by its 353 s."""
    from cudal1.types import Task

    seconds = task_seconds.TaskSeconds()
    judged = [Task(name=f"t{i}", source=f"# t{i}\n") for i in range(8)]
    for i, task in enumerate(judged):
        seconds.seed(task.hash, "compile-max-autotune-no-cudagraphs", 353.0 if i == 0 else 5.0 * i)
        seconds.seed(task.hash, "candidate", 10.0 + i)  # a task's longest is its longest of any kind
    fresh = "cudagraph"
    assert seconds.stand_in(Job(judged[3], None, fresh)) == 30.0  # 6th of 8: 11 12 15 20 25 30 35 353
    assert seconds.stand_in(Job(judged[0], None, fresh)) == 353.0
    seconds.note(Job(judged[1], None, fresh), 40.0)
    assert seconds.stand_in(Job(judged[2], None, fresh)) == 40.0  # now sized by its own kind


def test_a_graphed_compile_mode_is_sized_by_its_ungraphed_twin_on_its_task():
    """compile-max-autotune after its task's compile-max-autotune-no-cudagraphs (the same compile,
    its autotuning reused from the task's cache): sized by the twin's time alone, not by the
    task's longest job, so a level-3 model's 353 s twin leaves it 353 s, not a call's whole length
    of its slowest search verdict; a task without the twin is sized as any other."""
    from cudal1.types import Task

    seconds = task_seconds.TaskSeconds()
    model, small = Task(name="model", source="# m\n"), Task(name="small", source="# s\n")
    seconds.seed(model.hash, "candidate", 500.0)
    seconds.seed(model.hash, "compile-max-autotune-no-cudagraphs", 353.0)
    seconds.seed(small.hash, "compile-default", 12.0)
    assert seconds.stand_in(Job(model, None, "compile-max-autotune")) == 353.0
    assert seconds.stand_in(Job(small, None, "compile-reduce-overhead")) == 12.0
    assert seconds.stand_in(Job(small, None, "compile-max-autotune")) == 500.0  # no twin: the tasks' longest


def test_a_job_too_long_for_any_window_with_its_margin_starts_early_in_one_if_its_time_alone_fits(monkeypatch):
    """A job whose FIT_FACTOR x seconds + slack exceed the whole window (deadline from its setting)
    would start in no call, and its run never finish: in the window's first START_SHARE it starts
    where its seconds alone fit the time left; later, and for a job too long even without the
    margin, the usual rule holds."""
    from cudal1.harness.parent import drain

    monkeypatch.setattr(drain, "FIT_SLACK_S", 0.1)
    monkeypatch.setattr(drain, "START_SHARE", 0.2)
    try:
        drain.after(3.9, end=4.0).cancel()  # a deadline 4 s from now, no drain
        assert drain.admits(3.0)  # 4.6 s with its margin: more than the window, its 3.1 s fit
        assert drain.admits(float("inf"), 3.0)  # sized by a stand-in, the same
        assert not drain.admits(3.95)  # too long even without its margin
        assert drain.admits(2.0)  # 3.1 s: fits the usual way
        time.sleep(1.0)  # past the window's first 0.8 s
        assert not drain.admits(3.0) and not drain.admits(2.5)  # 4.6 s, 3.85 s: not in the 3 s left
        assert drain.admits(1.5)
    finally:
        drain.clear()


def test_out_of_time_drains_only_under_a_drain_or_a_deadline():
    from cudal1.harness.parent import drain

    try:
        assert not drain.out_of_time(False) and not drain.requested()  # no drain, no deadline: wait for work
        drain.after(60.0, end=120.0).cancel()  # a deadline alone
        assert not drain.out_of_time(True) and not drain.requested()
        assert drain.out_of_time(False) and drain.requested()  # nothing fits: the drain begins
    finally:
        drain.clear()
    assert drain.admits(float("inf")) and not drain.out_of_time(False)


def test_jobs_a_verdict_makes_possible_join_the_batch(fake, tmp_path):
    """``follow``: each verdict may add jobs (a build among them goes to the farm); they are
    judged in the same batch, numbered after the jobs so far; a lane with nothing pending waits
    for the running job's follow-ups instead of ending; the stats count every job."""
    chain = {"a": [job("a1", False), job("a2", True)], "a1": [job("a11", False)], "b": []}
    seen: list[tuple[int, str]] = []
    stats = []

    def follow(i: int, res: EvalResult) -> list[Job]:
        label = next(lb for lb in ("a11", "a1", "a2", "a", "b") if res.candidate_hash == by_label[lb].candidate.hash)
        return chain.get(label, [])

    by_label = {j.label: j for j in [job("a", False), job("b", False), *chain["a"], *chain["a1"]]}
    jobs = [by_label["a"], by_label["b"]]
    results = run_jobs(jobs, config(tmp_path, 1).replace(workers_per_gpu=2), plan=DevicePlan("cpu", (None,), ""),
                       on_result=lambda i, r: seen.append((i, r.candidate_hash)), on_stats=stats.append,
                       follow=follow)
    labels = ["a", "b", "a1", "a2", "a11"]
    assert [r.candidate_hash for r in results] == [by_label[x].candidate.hash for x in labels]
    assert sorted(seen) == [(i, by_label[x].candidate.hash) for i, x in enumerate(labels)]
    assert len(jobs) == 2  # the caller's list is the caller's
    started = times(fake.log, "judge_start")
    assert started["a2"] >= times(fake.log, "build_end")["a2"]  # built by the farm first
    assert started["a11"] > started["a1"] > started["a"]
    assert stats[0].jobs == 5 and sum(x.jobs for x in stats[0].lanes) == 5
    assert [j.label for j in stats[0].per_job] == labels


def test_follow_ups_run_in_rounds_where_a_backend_takes_fixed_batches():
    """``in_rounds`` (Ray's backend): the first batch, then its verdicts' follow-ups as the next,
    indices as one batch's, the rounds' stats merged into one."""
    from cudal1.harness.parent.batchstats import BatchStats

    calls: list[list[str]] = []

    def run(batch_jobs, each, stats):
        calls.append([j.label for j in batch_jobs])
        out = []
        for i, j in enumerate(batch_jobs):
            res = EvalResult(status=Status.OK, task_name="t", task_hash=TASK.hash, candidate_hash=j.label)
            each(i, res)
            out.append(res)
        stats(BatchStats(backend="ray", jobs=len(batch_jobs)))
        return out

    more = {"x": [job("x1", False), job("x2", False)], "x2": [job("x21", False)]}
    seen, merged = [], []
    from cudal1.harness.parent.ray_backend import in_rounds

    results = in_rounds(run, [job("x", False), job("y", False)], lambda i, r: seen.append((i, r.candidate_hash)),
                              merged.append, lambda i, r: more.get(r.candidate_hash, []))
    assert calls == [["x", "y"], ["x1", "x2"], ["x21"]]
    assert [r.candidate_hash for r in results] == ["x", "y", "x1", "x2", "x21"]
    assert seen == list(enumerate(["x", "y", "x1", "x2", "x21"]))
    assert len(merged) == 1 and merged[0].jobs == 5


def test_a_drain_leaves_follow_ups_unstarted(fake, tmp_path):
    """A drain requested with the first verdict: its follow-ups join but never start, and the
    batch raises Drained."""
    from cudal1.harness.parent import drain

    def follow(i: int, res: EvalResult) -> list[Job]:
        drain.request()
        return [job(f"f{i}", False)]

    try:
        with pytest.raises(drain.Drained, match=r"drained: 1 job\(s\) not started"):
            run_jobs([job("only", False)], config(tmp_path, 1), plan=DevicePlan("cpu", (None,), ""), follow=follow)
    finally:
        drain.clear()
    assert [label for e, label, _ in fake.log if e == "judge_start"] == ["only"]


def test_builds_start_at_once_up_to_the_budget_not_the_lanes(fake, tmp_path):
    jobs = [job(f"b{i}", True) for i in range(4)]
    stats = []
    run_jobs(jobs, config(tmp_path, 4), plan=DevicePlan("cpu", (None,), ""), on_stats=stats.append)
    starts = times(fake.log, "build_start").values()
    ends = times(fake.log, "build_end").values()
    assert max(starts) < min(ends), "builds were serialised behind the single lane"
    assert stats[0].max_concurrent_builds == 4


def test_identical_sources_share_a_build_in_a_batch(fake, tmp_path):
    jobs = [job("same", True), job("same", True), job("other", True)]
    stats = []
    run_jobs(jobs, config(tmp_path, 2), plan=DevicePlan("cpu", (None,), ""), on_stats=stats.append)
    assert sorted(label for e, label, _ in fake.log if e == "build_start") == ["other", "same"]
    assert [j.build for j in stats[0].per_job] == ["built", "shared", "built"]
    assert (stats[0].builds, stats[0].builds_shared) == (2, 1)


def test_batch_stats_add_up(fake, tmp_path):
    jobs = [job(f"b{i}", True) for i in range(3)] + [job(f"p{i}", False) for i in range(3)]
    stats = []
    run_jobs(jobs, config(tmp_path, 1), plan=DevicePlan("cuda", (0, 1), "9.0"), on_stats=stats.append)
    s = stats[0]
    assert s.jobs == 6 and len(s.lanes) == 2 and sum(x.jobs for x in s.lanes) == 6
    for lane in s.lanes:
        assert lane.startup_s + lane.busy_s + lane.idle_s == pytest.approx(lane.wall_s, abs=1e-6)
        assert lane.wall_s <= s.wall_s + 1e-6
    assert s.judge_s == pytest.approx(sum(x.busy_s for x in s.lanes), abs=1e-6) == pytest.approx(s.lane_busy_s)
    assert s.judge_s >= 6 * JUDGE_S * 0.99 and s.build_s >= 3 * BUILD_S * 0.99  # what the sleeps took, at least
    assert s.builds == 3 and s.builds_shared == 0 and s.build_workers == 1
    assert s.lane_idle_s > 0  # three plain jobs over two lanes, then waiting on serial builds
    assert 0 < s.idle_share < 1
    assert {j.lane for j in s.per_job} == {0, 1}
    d = s.to_dict(detail=True)
    assert json.loads(json.dumps(d))["jobs"] == 6 and len(d["per_job"]) == 6
    merged = s.merge(s)
    assert (merged.jobs, merged.batches) == (12, 2) and merged.judge_s == pytest.approx(2 * s.judge_s)


def test_a_lane_failure_surfaces(fake, tmp_path, monkeypatch):
    def boom(self, j, gpu, prebuilt):
        raise RuntimeError("judge bug")

    monkeypatch.setattr(FakeEvaluator, "evaluate_job", boom)
    with pytest.raises(RuntimeError, match="judge bug"):
        run_jobs([job("b", True), job("p", False)], config(tmp_path, 1), plan=DevicePlan("cpu", (None,), ""))


class MemoryBoundEvaluator(FakeEvaluator):
    """Judging needs the GPU's memory: a job that runs while another runs on its GPU is out of
    memory (its verdict says ``oom``); alone, it is ``ok``.  The log records how many ran.  The
    first two jobs wait for each other (``meet``), so neighbours really overlap."""

    running: dict = {}
    meet: threading.Barrier = threading.Barrier(2)
    judged = 0

    def evaluate_job(self, j: Job, gpu, prebuilt) -> EvalResult:
        with self.lock:
            type(self).judged += 1
            first_two = self.judged <= 2
            self.running[gpu] = self.running.get(gpu, 0) + 1
        if first_two:
            self.meet.wait(timeout=30)  # both are running now
        with self.lock:
            neighbours = self.running[gpu] - 1
            self.log.append(("judge_start", j.label, neighbours))
        time.sleep(JUDGE_S)
        with self.lock:
            neighbours = max(neighbours, self.running[gpu] - 1)
            self.running[gpu] -= 1
        base = dict(task_name=j.task.name, task_hash=j.task.hash, candidate_hash=j.candidate.hash)
        if neighbours:
            return EvalResult(
                status=Status.RUNTIME_ERROR, flags=["oom"], message="correctness: OutOfMemoryError", **base
            )
        return EvalResult(status=Status.OK, **base)


@pytest.mark.parametrize("share", [1, 3])
def test_a_job_out_of_memory_beside_neighbours_is_judged_again_alone(fake, tmp_path, monkeypatch, share):
    """With several workers per GPU, an OOM verdict may be the neighbours' doing: the job is
    judged again with the GPU to itself (new jobs held back, running ones finished first), and
    that verdict stands.  With one worker per GPU an OOM is the job's own: no second run."""
    MemoryBoundEvaluator.running, MemoryBoundEvaluator.judged = {}, 0
    MemoryBoundEvaluator.meet = threading.Barrier(2 if share > 1 else 1)
    monkeypatch.setattr(batch, "Evaluator", MemoryBoundEvaluator)
    monkeypatch.setattr(gpu_memory, "TASK_MEMORY", gpu_memory.TaskMemory())
    other = Task(name="small", source=TASK.source + "# another task\n")
    jobs = [job(f"p{i}", False) for i in range(6)]
    cfg = EvalConfig(device="cpu", cache_dir=str(tmp_path), build_workers=1, workers_per_gpu=share)
    results = run_jobs(jobs, cfg, plan=DevicePlan("cpu", (None,), ""))
    starts = [(label, n) for e, label, n in fake.log if e == "judge_start"]
    if share == 1:
        assert all(r.status is Status.OK and "rejudged_alone" not in r.flags for r in results)
        assert len(starts) == 6
        assert not gpu_memory.TASK_MEMORY.bound(TASK.hash)  # with one worker per GPU an OOM says nothing of neighbours
        return
    assert [r.status for r in results] == [Status.OK] * 6, [(r.status, r.flags) for r in results]
    again = [r for r in results if "rejudged_alone" in r.flags]
    assert again, "three workers on one device never ran out of memory together"
    assert len(starts) == 6 + len(again)
    for label in {label for label, _ in starts}:
        runs = [n for lb, n in starts if lb == label]
        if len(runs) > 1:
            assert runs[-1] == 0, f"{label} was judged again beside {runs[-1]} other job(s)"
    # The task is remembered: its next batch is judged alone at once, one run per job, no OOM;
    # another task still shares the GPU.
    assert gpu_memory.TASK_MEMORY.bound(TASK.hash) and not gpu_memory.TASK_MEMORY.bound(other.hash)
    fake.log.clear()
    MemoryBoundEvaluator.meet = threading.Barrier(1)
    later = run_jobs([job(f"q{i}", False) for i in range(4)], cfg, plan=DevicePlan("cpu", (None,), ""))
    assert [(r.status, "rejudged_alone" in r.flags) for r in later] == [(Status.OK, False)] * 4
    assert [n for e, _, n in fake.log if e == "judge_start"] == [0] * 4
    fake.log.clear()
    MemoryBoundEvaluator.meet = threading.Barrier(2)
    shared = run_jobs([Job(other, Candidate(f"# s{i}\n", task_hash=other.hash, label=f"s{i}")) for i in range(2)], cfg,
                      plan=DevicePlan("cpu", (None,), ""))
    assert any("rejudged_alone" in r.flags for r in shared)  # it tried the shared GPU first, as any task does


class BlockedBesideEvaluator(MemoryBoundEvaluator):
    """Judged beside another job, a side's timed calls are all blocked (``figures["blocked_calls"]``:
    the candidate's, or with ``reference_blocks`` the reference's, which then blocks alone too);
    alone, none are unless the reference blocks by itself."""

    reference_blocks = False

    def evaluate_job(self, j: Job, gpu, prebuilt) -> EvalResult:
        res = super().evaluate_job(j, gpu, prebuilt)
        beside = res.status is Status.RUNTIME_ERROR
        res.status, res.flags, res.message, res.speedup = Status.OK, [], "", 0.2 if beside else 1.5
        side = "reference" if self.reference_blocks else "candidate" if beside else None
        if side:
            res.figures["blocked_calls"] = {"reference": 0, "candidate": 0, side: 40,
                                            "calls": {"reference": 40, "candidate": 40}}
        return res


@pytest.mark.parametrize("reference_blocks", [False, True])
def test_a_verdict_whose_calls_were_blocked_beside_neighbours_is_judged_again_alone(fake, tmp_path, monkeypatch,
                                                                                     reference_blocks):
    """A side's calls mostly blocked beside other jobs (their GPU figure holds host time): the job is
    judged again with the GPU to itself, that verdict stands, and the first one's figures are kept
    beside it.  A reference that blocks alone too is remembered: later verdicts of its task are not
    judged again for it."""
    BlockedBesideEvaluator.running, BlockedBesideEvaluator.judged = {}, 0
    BlockedBesideEvaluator.meet = threading.Barrier(2)
    BlockedBesideEvaluator.reference_blocks = reference_blocks
    monkeypatch.setattr(batch, "Evaluator", BlockedBesideEvaluator)
    monkeypatch.setattr(gpu_memory, "TASK_MEMORY", gpu_memory.TaskMemory())
    cfg = EvalConfig(device="cpu", cache_dir=str(tmp_path), build_workers=1, workers_per_gpu=3)
    results = run_jobs([job(f"p{i}", False) for i in range(6)], cfg, plan=DevicePlan("cpu", (None,), ""))
    again = [r for r in results if "rejudged_alone" in r.flags]
    assert again, "three workers on one device never judged two jobs together"
    for r in again:
        assert r.figures["rejudged_alone"]["speedup"] == 0.2
        assert r.figures["rejudged_alone"]["blocked_calls"]
        assert ("reference" if reference_blocks else "candidate") in r.figures["rejudged_alone"]["because"]
        assert (r.speedup, "blocked_calls" in r.figures) == (1.5, reference_blocks)
    starts = [label for e, label, _ in fake.log if e == "judge_start"]
    assert len(starts) == 6 + len(again)
    if reference_blocks:  # remembered once alone: only jobs already judged beside it are judged again
        assert len(again) <= 3 and gpu_memory.TASK_MEMORY.reference_blocks(TASK.hash)
        kept = gpu_memory.TaskMemory()  # the next process of a resumed run reads it from the cache
        kept.attach(tmp_path)
        assert kept.reference_blocks(TASK.hash)
        fake.log.clear()
        later = run_jobs([job(f"q{i}", False) for i in range(4)], cfg, plan=DevicePlan("cpu", (None,), ""))
        assert not any("rejudged_alone" in r.flags for r in later)
        assert len([e for e, _, _ in fake.log if e == "judge_start"]) == 4
    else:
        assert not gpu_memory.TASK_MEMORY.reference_blocks(TASK.hash)
        assert all(r.speedup == 1.5 for r in results)


def test_a_blocked_side_needs_most_of_its_calls_an_ok_verdict_and_a_reference_not_known_to_block(monkeypatch):
    from cudal1.harness.parent.blocked import blocked_sides, worth_judging_alone

    def verdict(ref: int, cand: int, status=Status.OK) -> EvalResult:
        return EvalResult(status=status, figures={"blocked_calls": {
            "reference": ref, "candidate": cand, "calls": {"reference": 40, "candidate": 40}}})

    assert blocked_sides(verdict(0, 20)) == ("candidate",)
    assert blocked_sides(verdict(20, 19)) == ("reference",)
    assert blocked_sides(verdict(40, 40)) == ("candidate", "reference")
    assert blocked_sides(verdict(3, 19)) == ()
    assert blocked_sides(verdict(0, 40, Status.RUNTIME_ERROR)) == ()
    assert blocked_sides(EvalResult(status=Status.OK)) == ()
    monkeypatch.setattr(gpu_memory, "TASK_MEMORY", gpu_memory.TaskMemory())
    assert worth_judging_alone(verdict(40, 40), "t") == "candidate"
    gpu_memory.TASK_MEMORY.reference_blocked_alone("t")  # its reference blocks by itself
    assert worth_judging_alone(verdict(40, 40), "t") is None
    assert worth_judging_alone(verdict(40, 0), "t") is None
    assert worth_judging_alone(verdict(0, 40), "t") == "candidate"  # only the candidate's: its own figure


def test_gpu_gate_holds_new_jobs_back_while_one_waits_to_run_alone():
    gate = gpu_memory.GpuGate()
    never = lambda: False  # noqa: E731
    gate.enter(never)  # a neighbour is running
    order: list[str] = []
    alone = threading.Thread(target=lambda: gate.alone(lambda: order.append("alone"), never))
    alone.start()
    deadline = time.monotonic() + 10
    while not gate.solo and time.monotonic() < deadline:  # the solo job is waiting
        time.sleep(0.01)
    newcomer = threading.Thread(target=lambda: (gate.enter(never), order.append("new"), gate.leave()))
    newcomer.start()
    while not gate.held_back and time.monotonic() < deadline:  # the newcomer is held at the gate
        time.sleep(0.01)
    assert gate.held_back == 1
    assert order == []  # the solo job waits for the neighbour; the newcomer waits for the solo job
    gate.leave()
    alone.join(5)
    newcomer.join(5)
    assert order == ["alone", "new"]


class SharedMemoryEvaluator(FakeEvaluator):
    """Judging takes device memory: ``MIB`` per task on a GPU of ``CAPACITY``; a job that starts
    while the jobs running hold more than the GPU has left is out of memory.  Verdicts carry the
    job's memory as the parent's NVML watch would (``figures["gpu_memory_mib"]``)."""

    CAPACITY = 100
    MIB: dict = {}
    held = 0
    overlaps: list = []  # (label, labels running beside it when it started)
    running: dict = {}

    def evaluate_job(self, j: Job, gpu, prebuilt) -> EvalResult:
        cls = type(self)
        mib = cls.MIB[j.task.hash]
        with self.lock:
            beside = sorted(cls.running.values())
            fits = cls.held + mib <= cls.CAPACITY
            cls.overlaps.append((j.label, beside))
            cls.held += mib
            cls.running[id(j), time.monotonic()] = j.label
            key = next(k for k in cls.running if k[0] == id(j))
        time.sleep(JUDGE_S)
        with self.lock:
            cls.held -= mib
            del cls.running[key]
        base = dict(task_name=j.task.name, task_hash=j.task.hash, candidate_hash=j.candidate.hash)
        if not fits:
            return EvalResult(status=Status.RUNTIME_ERROR, flags=["oom"], message="OutOfMemoryError", **base)
        return EvalResult(status=Status.OK, figures={"gpu_memory_mib": mib}, **base)


def test_a_memory_bound_task_with_a_measured_share_runs_beside_jobs_that_fit(fake, tmp_path, monkeypatch):
    """A task that ran out of memory beside neighbours is no longer judged alone once its memory
    is measured: its jobs enter beside others while their shares fit in the GPU's memory, never
    two of them at once where two do not fit, and nothing runs out of memory.  The measured
    shares outlive the process (the cache directory's ``gpu_memory.json``)."""
    big = Task(name="big", source=TASK.source + "# big\n")
    small = Task(name="small", source=TASK.source + "# small\n")
    SharedMemoryEvaluator.MIB = {big.hash: 50, small.hash: 10}
    SharedMemoryEvaluator.held, SharedMemoryEvaluator.overlaps, SharedMemoryEvaluator.running = 0, [], {}
    monkeypatch.setattr(batch, "Evaluator", SharedMemoryEvaluator)
    monkeypatch.setattr(gpu_memory, "TASK_MEMORY", gpu_memory.TaskMemory())
    monkeypatch.setattr(gpu_memory, "gpu_capacity_mib", lambda gpu: SharedMemoryEvaluator.CAPACITY)
    cfg = EvalConfig(device="cpu", cache_dir=str(tmp_path), build_workers=1, workers_per_gpu=3)
    plan = DevicePlan("cpu", (None,), "")

    def jobs(tag: str) -> list[Job]:
        return [Job(t, Candidate(f"# {tag}{i}\n", task_hash=t.hash, label=f"{t.name}:{tag}{i}"))
                for i in range(3) for t in (big, small)]

    # first batch: nothing measured; the big task runs out of memory beside its own second job
    # (50 + 50 + 10 > 100) and is judged again alone, as before
    first = run_jobs(jobs("a"), cfg, plan=plan)
    assert all(r.status is Status.OK for r in first)
    assert gpu_memory.TASK_MEMORY.bound(big.hash)
    memory = gpu_memory.TASK_MEMORY
    assert memory.need(big.hash) == 58 and memory.need(small.hash) == 12  # 1.15x measured
    # later batches: shares of 58 and 12 in 92 of 100: one big job beside small ones, no OOM
    SharedMemoryEvaluator.overlaps = []
    later = run_jobs(jobs("b") + jobs("c"), cfg, plan=plan)
    assert [(r.status, r.flags) for r in later] == [(Status.OK, [])] * 12
    started = SharedMemoryEvaluator.overlaps
    assert len(started) == 12  # one run per job
    assert any(label.startswith("big") and beside for label, beside in started), started  # not alone
    assert not any(label.startswith("big") and any(b.startswith("big") for b in beside) for label, beside in started)
    # a new process (a resumed run) starts with the shares and knows the task is memory-bound,
    # from the cache directory: its first job there waits for room instead of running out of memory
    again = gpu_memory.TaskMemory()
    again.attach(tmp_path)
    assert again.need(big.hash) == 58 and again.need(small.hash) == 12 and again.bound(big.hash)
    monkeypatch.setattr(gpu_memory, "TASK_MEMORY", again)
    SharedMemoryEvaluator.overlaps = []
    resumed = run_jobs(jobs("d"), cfg, plan=plan)
    assert [(r.status, r.flags) for r in resumed] == [(Status.OK, [])] * 6


def test_gpu_gate_admits_memory_bound_jobs_by_their_shares_first_come_first_served():
    gate = gpu_memory.GpuGate(capacity_mib=100)  # 92 for shares
    never = lambda: False  # noqa: E731
    gate.enter(never, 60)  # a job of a measured task is running
    entered: list[str] = []

    def come(name: str, need: int, bound: bool) -> threading.Thread:
        t = threading.Thread(target=lambda: (gate.enter(never, need, wait_for_room=bound), entered.append(name)))
        t.start()
        return t

    deadline = time.monotonic() + 10
    waiter = come("bound40", 40, True)  # 60 + 40 > 92: waits for room
    while not gate.waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    late = come("bound20", 20, True)  # 60 + 20 fits, but not beside bound40's room: waits behind it
    other = come("other30", 30, False)  # not memory-bound, but 60 + 30 would take bound40's room
    while gate.held_back < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gate.fits_now(30) and gate.fits_now(0)
    come("none", 0, False).join(5)  # a job with no share enters as before
    assert entered == ["none"] and gate.held_mib == 60
    gate.leave(60)
    for t in (waiter, late, other):
        t.join(5)
    assert sorted(entered) == ["bound20", "bound40", "none", "other30"] and gate.held_mib == 90 and gate.active == 4


def test_unknown_backend_is_an_error():
    with pytest.raises(batch.HarnessError, match="unknown backend"):
        DevicePlan("cpu", (None,), "").with_backend("dask")


# ---- the real judge, through the CLI ---------------------------------------------------------------

@pytest.mark.cpu
def test_judge_suite_summary_reports_where_time_went(tmp_path, capsys):
    from cudal1.cli.main import main

    cands = tmp_path / "c.jsonl"
    code = (REPO / "examples" / "candidates" / "diag_matmul_broadcast.py").read_text()
    cands.write_text(
        json.dumps({"task": "diag_matmul", "code": code})
        + "\n"
        + json.dumps({"task": "diag_matmul", "code": (REPO / "tests/fixtures/cpu/mutates_input.py").read_text()})
        + "\n"
    )
    out = tmp_path / "out"
    rc = main(["judge-suite", "--candidates", str(cands), "--suite", str(SMALL_DIAG),
               "--out", str(out), "--device", "cpu", "--trials", "3", "--timing-trials", "10", "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = json.loads((out / "summary.json").read_text())
    assert printed == saved
    for key in ("evaluated", "statuses", "speedup_geomean", "fast_1", "out", "device", "lanes"):  # unchanged fields
        assert key in saved
    assert saved["statuses"] == {"ok": 1, "rejected": 1}
    batch = saved["batch"]
    assert saved["backend"] == "local" and batch["backend"] == "local" and batch["jobs"] == 2
    assert batch["judge_s"] > 0 and batch["judge_s"] <= batch["wall_s"] + 1e-3


@pytest.mark.cpu
def test_verify_report_carries_batch_stats(tmp_path, capsys):
    from cudal1.cli.main import main

    records = tmp_path / "r.jsonl"
    records.write_text(
        json.dumps({"task": "diag_matmul", "code": (REPO / "tests/fixtures/cpu/wrong.py").read_text()}) + "\n"
    )
    out = tmp_path / "v"
    rc = main(
        [
            "verify", str(records), "--suite", str(REPO / "examples" / "tasks"), "--out", str(out),
            "--device", "cpu", "--trials", "3", "--json",
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    report = json.loads((out / "verify_report.json").read_text())
    assert printed["batch"] == report["summary"]["batch"]
    assert report["summary"]["batch"]["jobs"] == 1 and "classes" in report["summary"]
    assert (
        main(
            [
                "verify", str(records), "--suite", str(REPO / "examples" / "tasks"), "--out", str(out),
                "--device", "cpu", "--trials", "3", "--json",
            ]
        )
        == 0
    )  # resumed: nothing judged, no batch
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["batch"] is None


def test_in_worker_builds_count_as_gpu_idle():
    from types import SimpleNamespace

    from cudal1.harness.parent.batchstats import StatsRecorder

    rec = StatsRecorder("local", [SimpleNamespace(label="a"), SimpleNamespace(label="b")], 2, 1)
    rec.lane_start(0)
    rec.lane_wait(0, 1.0)  # startup
    rec.judged(0, 0, 10.0, worker_build_s=6.0)  # a build the pre-build did not reach, inside the worker
    rec.lane_wait(0, 2.0)  # idle after the first job
    rec.judged(0, 1, 4.0, worker_build_s=99.0)  # clipped to the job's own time
    rec.lane_end(0, 17.0)
    s = rec.finish()
    assert s.lane_build_s == pytest.approx(10.0) and s.lane_busy_s == pytest.approx(14.0)
    assert s.idle_share == pytest.approx(2.0 / 16.0)
    assert s.gpu_idle_share == pytest.approx(12.0 / 16.0)
    assert s.to_dict()["gpu_idle_share"] == pytest.approx(0.75)
    assert s.merge(s).lane_build_s == pytest.approx(20.0)


def test_lanes_unused_share_counts_each_lanes_tail_and_merges_by_lane_time():
    from types import SimpleNamespace

    from cudal1.harness.parent.batchstats import BatchStats, StatsRecorder

    four = BatchStats(lane_busy_s=30.0, lane_span_s=4 * 10.0)  # four lanes, 10 s: one lane's tail of 10 s unused
    two = BatchStats(lane_busy_s=10.0, lane_span_s=2 * 5.0)  # two lanes busy throughout
    assert four.lanes_unused_share == pytest.approx(0.25) and two.lanes_unused_share == pytest.approx(0.0)
    assert four.merge(two).lanes_unused_share == pytest.approx(10.0 / 50.0)  # by lane time, not by batch
    assert four.to_dict()["lanes_unused_share"] == pytest.approx(0.25)
    assert BatchStats().lanes_unused_share is None
    rec = StatsRecorder("local", [SimpleNamespace(label="a")], 1, 1)
    rec.lane_start("0/0")
    rec.lane_start("0/1")  # a lane that never judged: all of its time is unused
    rec.judged("0/0", 0, 0.0)
    s = rec.finish()
    assert s.lane_span_s == pytest.approx(2 * s.wall_s) and s.lanes_unused_share == pytest.approx(1.0)


def test_gpu_idle_share_from_worker_timelines():
    from types import SimpleNamespace

    from cudal1.harness.parent.batchstats import StatsRecorder, union_s

    assert union_s([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == pytest.approx(4.0)
    rec = StatsRecorder("local", [SimpleNamespace(label="a"), SimpleNamespace(label="b")], 2, 1)
    # two workers sharing GPU 0: setup/import are idle, the GPU phases overlap in [4, 5]
    rec.gpu_phases(0, [("setup", 0.0, 2.0), ("reference", 2.0, 5.0), ("import", 5.0, 6.0), ("timing", 6.0, 8.0)])
    rec.gpu_phases(0, [("setup", 1.0, 4.0), ("correctness", 4.0, 6.0), ("lane", 6.0, 8.0), ("timing", 8.0, 10.0)])
    s = rec.finish()
    assert s.gpu_span_s == pytest.approx(10.0) and s.gpu_busy_s == pytest.approx(8.0)  # [2, 10]
    assert s.gpu_idle_share == pytest.approx(0.2) and s.lease_wait_s == pytest.approx(2.0)
    assert s.merge(s).gpu_idle_share == pytest.approx(0.2)


@pytest.mark.cpu
@pytest.mark.parametrize("order", ["any", "choices-first"])
def test_workers_sharing_a_device_never_time_alongside_gpu_work(shared_device_batch, order):
    """The GPU lease, through the real judge on the CPU: three lanes share the device (two sharing
    is the same lease with one holder fewer), and no job's timing phase overlaps any other job's
    GPU phase, while their start-ups do overlap; under either order of the lease's waiters."""
    share = 3
    results, stats = shared_device_batch("cpu", share, lease_order=order)
    assert len(stats.lanes) == share
