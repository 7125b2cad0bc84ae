"""The Ray backend (CPU tier): a local Ray cluster started inside the test (loopback only) judges
small CPU tasks with the same statuses and result shape as the local backend; a timing actor
killed mid-run is replaced, its jobs run again, and the run store loses nothing.  Without Ray,
the core imports and ``--backend ray`` is a one-line error naming the extra."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import SMALL_DIAG
from cudal1.flags import LOAD_DEPENDENT
from cudal1.harness import DevicePlan, Job, run_jobs
from cudal1.tasks import load_task_file
from cudal1.types import Candidate, Status

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "cpu"
TASKS = REPO / "examples" / "tasks"
SMALL = SMALL_DIAG.parent  # cheaper copies of bundled tasks (same names)


@pytest.mark.cpu
def test_core_imports_and_cli_explains_without_ray(tmp_path):
    cands = tmp_path / "c.jsonl"
    cands.write_text(json.dumps({"task": "diag_matmul", "code": (FIX / "wrong.py").read_text()}) + "\n")
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import cudal1.harness, cudal1.harness.parent.ray_backend, cudal1.recorded\n"
        "from cudal1.cli.main import main\n"
        f"sys.exit(main(['judge-suite', '--candidates', {str(cands)!r}, '--suite', {str(TASKS / 'diag_matmul.py')!r}, "
        f"'--out', {str(tmp_path / 'out')!r}, '--device', 'cpu', '--backend', 'ray']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and 'pip install "cudal1[distributed]"' in lines[0], proc.stderr


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    from cudal1.harness.parent import ray_backend

    if ray.is_initialized():
        pytest.skip("a Ray session is already running in this process")
    ray_backend.connect(None, num_cpus=2)
    assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes()), "the test cluster must be loopback-only"
    yield ray_backend
    ray.shutdown()
    ray_backend._pools.clear()


@pytest.fixture(scope="module")
def judge_config(cpu_judge_config, tmp_path_factory):
    return cpu_judge_config(tmp_path_factory.mktemp("cache"), timeout_s=30.0)


def pairs_of(spec: list[tuple[str, Path]]) -> list[tuple]:
    tasks = {
        name: load_task_file((SMALL if (SMALL / f"{name}.py").exists() else TASKS) / f"{name}.py")
        for name in {t for t, _ in spec}
    }
    return [(tasks[t], Candidate(path.read_text(), task_hash=tasks[t].hash, label=path.stem)) for t, path in spec]


@pytest.mark.cpu
def test_ray_backend_judges_like_the_local_backend(cluster, judge_config, tmp_path):
    pairs = pairs_of([("diag_matmul", FIX / "honest_einsum.py"), ("diag_matmul", FIX / "mutates_input.py"),
                      ("diag_matmul", FIX / "no_modelnew.py"), ("diag_matmul", FIX / "tamper_perf_counter.py"),
                      ("linear_relu", REPO / "examples" / "candidates" / "linear_relu_addmm.py")])
    # two identical candidates that go through the pre-build (an import that builds nothing): one build task
    task = pairs[0][0]
    builds = (FIX / "honest_expand.py").read_text() + "\nfrom torch.utils.cpp_extension import load_inline  # noqa\n"
    pairs += [(task, Candidate(builds, task_hash=task.hash, label=f"prebuilt{i}")) for i in range(2)]
    jobs = [Job(t, c) for t, c in pairs]
    plan = cluster.cluster_plan("cpu")
    assert (plan.backend, plan.device, plan.lanes) == ("ray", "cpu", (None,))
    local_stats, ray_stats = [], []
    local = run_jobs(jobs, judge_config, plan=DevicePlan.detect("cpu"), on_stats=local_stats.append)
    # a cache of its own: in the local run's cache, the pre-built source would be found and not pre-built again
    remote_config = dataclasses.replace(judge_config, cache_dir=str(tmp_path / "ray-cache"))
    remote = run_jobs(jobs, remote_config, plan=plan, on_stats=ray_stats.append)
    assert [r.status for r in remote] == [r.status for r in local]
    assert [r.status for r in remote] == [Status.OK, Status.REJECTED, Status.COMPILE_ERROR, Status.REJECTED, Status.OK,
                                          Status.OK, Status.OK]
    assert (
        "build_cached" in remote[-1].flags and "build_cached" in local[-1].flags
    )  # the second shared the first's build
    for (_, cand), a, b in zip(pairs, local, remote):
        assert type(a) is type(b) and set(a.to_dict()) == set(b.to_dict())
        assert (a.task_hash, a.candidate_hash, a.config_hash, a.phase) == (
            b.task_hash, b.candidate_hash, b.config_hash, b.phase,
        )
        verdict = [(r.correctness.passed == r.correctness.trials, r.correctness.failing_trial, r.correctness.rule)
                   for r in (a, b)]
        assert verdict[0] == verdict[1], (cand.label, verdict)
        # every flag but those the host's load at that moment decides (statuses compared above)
        assert set(a.flags) - LOAD_DEPENDENT == set(b.flags) - LOAD_DEPENDENT, (cand.label, a.flags, b.flags)
    s = ray_stats[0]
    assert s.backend == "ray" and s.jobs == 7 and s.retries == 0
    for stats in (s, local_stats[0]):
        assert [j.build for j in stats.per_job] == ["none"] * 5 + ["built", "shared"]
        assert stats.builds == 1 and stats.build_s > 0
    assert s.judge_s == pytest.approx(s.lane_busy_s) and s.judge_s <= s.wall_s * 1.05


@pytest.mark.cpu
def test_follow_ups_are_judged_on_the_cluster_as_a_next_batch(cluster, judge_config):
    (task, first), (_, second) = pairs_of([("diag_matmul", FIX / "honest_einsum.py"),
                                           ("diag_matmul", FIX / "no_modelnew.py")])
    seen, stats = [], []
    results = run_jobs([Job(task, first)], judge_config, plan=cluster.cluster_plan("cpu"),
                       on_result=lambda i, r: seen.append((i, r.status)), on_stats=stats.append,
                       follow=lambda i, r: [Job(task, second)] if i == 0 else [])
    assert [r.status for r in results] == [Status.OK, Status.COMPILE_ERROR]
    assert seen == [(0, Status.OK), (1, Status.COMPILE_ERROR)]
    assert len(stats) == 1 and (stats[0].jobs, stats[0].batches) == (2, 2)  # two rounds, one record


@pytest.mark.cpu
def test_a_killed_actor_loses_no_recorded_result(cluster, judge_config, tmp_path):
    from cudal1.recorded import judge_recorded
    from cudal1.store import RunStore

    spec = [("diag_matmul", FIX / "mutates_input.py"), ("diag_matmul", FIX / "wrong.py"),
            ("diag_matmul", FIX / "honest_expand.py"), ("diag_matmul", FIX / "wrong_shape.py"),
            ("linear_relu", REPO / "examples" / "candidates" / "linear_relu_addmm.py")]
    pairs = pairs_of(spec)
    plan = cluster.cluster_plan("cpu")
    before = cluster.actor_pids(None, "cpu")
    killed: list[int] = []

    def kill_once(res) -> None:
        if not killed:  # the actor holds the next job(s) by now
            killed.append(before[0])
            os.kill(before[0], signal.SIGKILL)

    stats = []
    with RunStore(tmp_path / "store.sqlite") as store:
        results = judge_recorded(
            pairs, judge_config, store=store, plan=plan, on_result=kill_once, on_stats=stats.append
        )
        recorded = [store.get_evaluation(t.hash, c.hash, judge_config.hash()) for t, c in pairs]
    assert killed
    want = [Status.REJECTED, Status.INCORRECT, Status.OK, Status.INCORRECT, Status.OK]
    assert [r.status for r in results] == want, [(r.status, r.message[:200]) for r in results]
    assert all(r is not None for r in recorded), "a verdict was lost"
    assert [r.status for r in recorded] == want
    s = stats[0]
    assert s.retries >= 1 and max(j.attempts for j in s.per_job) >= 2
    assert cluster.actor_pids(None, "cpu") != before  # a fresh actor took the slot


@pytest.mark.cpu
def test_grpo_rewards_are_judged_on_the_cluster(cluster, judge_config, tmp_path):
    """The training reward path (``JudgeReward`` → ``RolloutJudge`` → the judge) on a Ray plan gives
    the rewards and verdicts the local backend gives, and records them in the driver's store."""
    from cudal1.recorded import RecordedJudge
    from cudal1.store import RunStore
    from cudal1.train.judging import RolloutJudge
    from cudal1.train.reward import RewardConfig, RunningStats
    from cudal1.train.stages.contrast import ContrastivePrompts
    from cudal1.train.stages.grpo import JudgeReward

    task = load_task_file(TASKS / "diag_matmul.py")
    answers = [
        f"Analysis.\n```python\n{(FIX / name).read_text()}```"
        for name in ("honest_einsum.py", "wrong.py", "mutates_input.py")
    ]
    answers.append("no code at all")
    seen = {}
    for plan in (DevicePlan.detect("cpu"), cluster.cluster_plan("cpu")):
        with RunStore(tmp_path / f"{plan.backend}.sqlite") as store:
            judge = RolloutJudge(RecordedJudge(judge_config, store, plan=plan), "grpo")
            contrast = ContrastivePrompts(judge, [task])
            messages = contrast.prompt(task).messages()
            reward = JudgeReward(judge, contrast, RewardConfig(), RunningStats(64))
            rewards = reward(
                [messages] * 4, [[{"role": "assistant", "content": a}] for a in answers], [task.task_id] * 4
            )
            kinds = reward.metrics()["judged"]
            recorded = len(store.responses())
        seen[plan.backend] = (rewards, kinds, recorded)
    rewards, kinds, recorded = seen["ray"]
    assert kinds == seen["local"][1] == {"ok": 1, "incorrect": 1, "rejected": 1, "format": 1}
    assert rewards[1:] == seen["local"][0][1:]  # the fixed penalties; the success's is normalised
    assert rewards[0] > max(rewards[1:]) and recorded == 4


def test_train_and_collect_check_the_backend_flags(tmp_path, capsys):
    from cudal1.cli.main import main

    def error(*argv: str) -> str:
        capsys.readouterr()
        assert main(list(argv)) == 2
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(lines) == 1, lines
        return lines[0]

    assert "--workers-per-gpu is for the local backend" in error(
        "train", "grpo", "--smoke", "--backend", "ray", "--workers-per-gpu", "2", "--out", str(tmp_path / "g"))
    assert "--ray-address needs --backend ray" in error(
        "train", "ssl", "--smoke", "--ray-address", "127.0.0.1:1", "--out", str(tmp_path / "s"))
    assert "--workers-per-gpu is for the local backend" in error(
        "collect", "--smoke", "--backend", "ray", "--workers-per-gpu", "2", "--out", str(tmp_path / "c.jsonl"))
