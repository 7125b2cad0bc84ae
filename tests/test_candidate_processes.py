"""What the candidate's process starts, as the clean side holds it (harness.proctree, child.seal):
its whole process tree is found (a subreaper keeps orphans in it), stopped while the reference
is timed, counted after the seal, and killed with the job; after the seal it can start nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cli_support import small_config
from cudal1.harness.child.seal import seal_program
from cudal1.harness.proctree import CandidateTree, state_of
from proc_support import left_running

REPO = Path(__file__).resolve().parent.parent

# A stand-in for the candidate's process: a subreaper that is not dumpable (as the confined one),
# with two helpers in sessions of their own and a double-forked daemon.
TREE = textwrap.dedent("""
    import ctypes, os, subprocess, sys, time
    from cudal1.harness.proctree import become_subreaper
    assert become_subreaper()
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # not dumpable, as a confined candidate is
    helpers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
               for _ in range(2)]
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            time.sleep(60)
            os._exit(0)
        os._exit(0)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "spawn":
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
            print("spawned", flush=True)
""")


@pytest.fixture
def tree_root():
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # the daemon's middle process has exited: the daemon is re-parented to the subreaper
    yield proc
    CandidateTree(proc.pid).kill()
    proc.wait(timeout=10)


@pytest.mark.cpu
def test_the_tree_holds_helpers_in_other_sessions_and_orphaned_daemons(tree_root):
    tree = CandidateTree(tree_root.pid)
    members = tree.members()
    assert tree_root.pid in members
    alive = [p for p in members - {tree_root.pid} if state_of(p) not in ("Z", "")]
    assert len(alive) == 3, members  # two helpers and the daemon (its exited parent is a zombie or gone)
    frozen = tree.freeze()
    tree.stop()
    assert all(state_of(p) in ("T", "t", "Z", "") for p in frozen), {p: state_of(p) for p in frozen}
    tree.cont()
    assert all(state_of(p) not in ("T", "t") for p in frozen), {p: state_of(p) for p in frozen}
    tree_root.stdin.write("spawn\n")
    tree_root.stdin.flush()
    assert tree_root.stdout.readline().strip() == "spawned"
    assert len(tree.new_since_freeze()) == 1
    victims = set(frozen) | tree.members()
    tree.release()
    tree.kill()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(state_of(p) not in ("", "Z") for p in victims):
        time.sleep(0.02)
    assert all(state_of(p) in ("", "Z") for p in victims), {p: state_of(p) for p in victims}


SEALED = textwrap.dedent("""
    import os, subprocess, sys, threading
    from cudal1.harness.child.seal import seal
    print(seal(), flush=True)
    t = threading.Thread(target=lambda: None)
    t.start(); t.join()
    import torch
    torch.ones(512, 512).sum()  # torch's own threads start
    print("threads fine", flush=True)
    if sys.argv[1] == "spawn":
        subprocess.run(["true"])
    elif sys.argv[1] == "fork":
        os.fork()
    print("survived", flush=True)
""")


@pytest.mark.cpu
@pytest.mark.parametrize("how", ["none", "spawn", "fork"])
def test_a_sealed_process_can_start_threads_but_no_process(how):
    done = subprocess.run([sys.executable, "-c", SEALED, how], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    lines = done.stdout.splitlines()
    assert lines[0].startswith("applied"), done.stdout + done.stderr
    assert "threads fine" in lines
    if how == "none":
        assert done.returncode == 0 and "survived" in lines
    else:
        assert done.returncode == -signal.SIGSYS and "survived" not in lines, (done.returncode, done.stdout)


# torch.compile's compile-worker pool, as Inductor starts it: a sidecar that starts its workers when
# it gets to them (on a 16-core H200 they appeared after the seal: new_process for honest code).
POOL = textwrap.dedent("""
    import os, sys, time
    import torch._inductor.config as config
    from torch._inductor.async_compile import AsyncCompile
    from cudal1.harness.child.seal import seal, stop_compile_workers
    from cudal1.harness.proctree import descendants
    config.compile_threads = 2
    AsyncCompile.process_pool()
    AsyncCompile.warm_pool()
    deadline = time.monotonic() + 60
    while not descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("pool", len(descendants(os.getpid())), flush=True)
    print("stopped", stop_compile_workers(), flush=True)
    time.sleep(1.0)  # a worker the sidecar was about to start would be here by now
    print("left", len(descendants(os.getpid())), flush=True)
    print(seal(), flush=True)
""")


@pytest.mark.cpu
def test_the_compile_worker_pool_is_shut_down_before_the_seal():
    done = subprocess.run([sys.executable, "-c", POOL], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert lines[0] != "pool 0" and lines[1] == "stopped True" and lines[2] == "left 0", lines
    assert lines[3].startswith("applied"), lines


def test_no_compile_workers_to_stop_without_inductor(monkeypatch):
    from cudal1.harness.child.seal import stop_compile_workers

    monkeypatch.delitem(sys.modules, "torch._inductor.async_compile", raising=False)
    assert stop_compile_workers() is False


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seal_program_jumps_stay_inside(machine):
    program = seal_program(machine)
    assert program[0] == (0x20, 0, 0, 4)  # the architecture first
    for at, (code, jt, jf, _) in enumerate(program):
        if code in (0x15, 0x45):
            assert at + 1 + max(jt, jf) < len(program)
    kills = sum(1 for code, _, _, k in program if code == 0x06 and k == 0x80000000)
    assert kills == (3 if machine == "x86_64" else 1)  # fork, vfork, clone without CLONE_THREAD


@pytest.mark.cpu
def test_helpers_never_run_while_the_reference_is_timed(tmp_path, cpu_judge_config):
    """The spinner fixture's helpers (other sessions, burning a core whenever the candidate is
    stopped) are watched from outside while the real judge times it: whenever the candidate's
    process is stopped, so are they; and they are gone once the verdict is in."""
    from cudal1.harness import evaluate_pairs
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate, Status

    source = (REPO / "tests/fixtures/cpu/spinners_while_stopped.py").read_text()
    task = load_task_file(REPO / "tests/fixtures/cpu_tasks/linear_relu.py")
    result: dict = {}
    judge = threading.Thread(target=lambda: result.update(
        r=evaluate_pairs([(task, Candidate(source, task_hash=task.hash))], cpu_judge_config(tmp_path / "cache"))[0]))
    judge.start()
    seen = {"stopped": 0, "helper_running": 0}
    helpers: dict[int, int] = {}  # helper pid -> the candidate's pid it watches (its last argument)
    while judge.is_alive():
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in helpers:
                try:
                    parts = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if any(b"stopped()" in p for p in parts) and len(parts) >= 2 and parts[-2].isdigit():
                    helpers[int(entry)] = int(parts[-2])
        live = [p for p in helpers if state_of(p) not in ("", "Z")]
        if live:
            cand = helpers[live[0]]
            if state_of(cand) == "T":  # read the candidate, the helpers, the candidate again: a block was on
                running = any(state_of(p) == "R" for p in live)  # throughout (cont() wakes the candidate first)
                if state_of(cand) == "T":
                    seen["stopped"] += 1
                    seen["helper_running"] += running
        time.sleep(0.001)
    r = result["r"]
    assert r.status is Status.OK, r.message
    assert len(helpers) == 2 and seen["stopped"] >= 5, seen
    assert seen["helper_running"] == 0, seen
    deadline = time.monotonic() + 5  # killed with the job (a killed process takes a moment to be gone)
    while time.monotonic() < deadline and any(state_of(p) not in ("", "Z") for p in helpers):
        time.sleep(0.02)
    assert all(state_of(p) in ("", "Z") for p in helpers), {p: state_of(p) for p in helpers}
    assert r.environment.isolation["new_processes"].startswith("applied"), r.environment.isolation
    assert "2 helper process(es)" in r.environment.isolation["new_processes"]


@pytest.mark.cpu
def test_orphans_are_the_servers_children_outside_its_session_and_its_jobs():
    """A stand-in server with three children: a job (a session of its own, registered), a
    process in the server's session (another user of a shared forkserver: never ours to kill)
    and a helper in a session of its own (what a dead candidate left behind): only the last."""
    from cudal1.harness.proctree import orphans

    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys
        sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
        kids = [subprocess.Popen(sleep, start_new_session=True), subprocess.Popen(sleep),
                subprocess.Popen(sleep, start_new_session=True)]
        print(" ".join(str(k.pid) for k in kids), flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    job, neighbour, helper = (int(x) for x in server.stdout.readline().split())
    try:
        assert orphans(server.pid, {job}) == {helper}
        assert orphans(server.pid, {job, helper}) == set()
    finally:
        for pid in (job, neighbour, helper):
            os.kill(pid, signal.SIGKILL)
        server.kill()
        server.wait(timeout=10)


@pytest.mark.cpu
@pytest.mark.parametrize("confine", [True, False], ids=["confined", "unconfined"])
def test_a_helper_whose_candidate_died_first_dies_with_the_job(tmp_path, cpu_judge_config, confine):
    """The candidate's process starts a helper in a session of its own, then exits: the helper,
    re-parented to the judge's forkserver (a subreaper), is killed with the job, not left running
    under init.  Confined or not (the forkserver's part does not depend on the confinement)."""
    from cudal1.harness import evaluate_pairs
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate, Status

    marker = b"cudal1-fixture-orphan"
    left_running(marker, wait_s=0)  # from an earlier run of the corpus
    source = (REPO / "tests/fixtures/cpu/helper_outlives_its_process.py").read_text()
    task = load_task_file(REPO / "tests/fixtures/cpu_tasks/linear_relu.py")
    r = evaluate_pairs([(task, Candidate(source, task_hash=task.hash))],
                       cpu_judge_config(tmp_path / "cache", confine_candidates=confine))[0]
    assert r.status is Status.RUNTIME_ERROR, r.message
    left = left_running(marker)
    assert not left, f"helper(s) {left} outlived the job"


@pytest.mark.cpu
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding needs two CPUs")
def test_cpu_timed_jobs_bind_their_threads_one_job_at_a_time(tmp_path, cpu_judge_config):
    """On the CPU clock both processes put their main thread on one CPU and their OpenMP workers
    on the others (the candidate's report says so in ``environment.isolation``), and in-call wait
    shares are read; with two jobs timed side by side (``workers_per_gpu=2``) nothing is bound."""
    from cudal1.harness import evaluate_pairs
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate, Status

    task = load_task_file(REPO / "tests/fixtures/cpu_tasks/linear_relu.py")
    source = task.source.replace("class Model(", "class ModelNew(")
    (r,) = evaluate_pairs([(task, Candidate(source, task_hash=task.hash))], cpu_judge_config(tmp_path / "cache"))
    assert r.status is Status.OK, r.message
    assert r.environment.isolation["cpu_binding"].startswith("applied: main thread on CPU"), r.environment.isolation
    shares = r.figures["contention"]["host"]["wait_share"]
    assert 0.0 <= shares["candidate"] <= 1.0 and 0.0 <= shares["reference"] <= 1.0
    (side_by_side,) = evaluate_pairs([(task, Candidate(source, task_hash=task.hash))],
                                     cpu_judge_config(tmp_path / "cache2", workers_per_gpu=2))
    assert "cpu_binding" not in side_by_side.environment.isolation


@pytest.mark.cpu
def test_identical_code_beside_busy_processes_claims_nothing(tmp_path, cpu_judge_config):
    """An A/A verdict (the reference against itself) with two processes spinning beside the judge
    on this host never says faster or slower, and its CI includes 1.0 or it says ``contended``
    (with the evidence).  The acceptance allows 1 verdict in 20 to miss the second part
    (benchmarks/aa_load.py measures it over 20): a miss is judged once more, and two misses in a
    row (under 1 in 400 at that rate) fail."""
    from cudal1.harness import evaluate_pairs
    from cudal1.speedup import faster, slower
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate, Status

    task = load_task_file(REPO / "tests/fixtures/cpu_tasks/linear_relu.py")
    source = task.source.replace("class Model(", "class ModelNew(")
    misses = []
    for attempt in range(2):
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            (r,) = evaluate_pairs([(task, Candidate(source, task_hash=task.hash))],
                                  cpu_judge_config(tmp_path / f"cache{attempt}"))
        finally:
            for p in spinners:
                p.kill()
        assert r.status is Status.OK, r.message
        host = r.figures["contention"]["host"]
        assert host["cpus"] >= 1 and 0.0 <= host["wait_share"]["reference"] <= 1.0
        assert not faster(r) and not slower(r), (r.speedup, r.speedup_ci, r.flags, host)
        if "contended" in r.flags:
            assert "waited" in r.message
            return
        if r.speedup_ci[0] <= 1.0 <= r.speedup_ci[1]:
            return
        misses.append((r.speedup_ci, host["wait_share"]))
    pytest.fail(f"two A/A verdicts in a row exclude 1.0 without saying contended: {misses}")


@pytest.mark.cpu
def test_an_identical_tiny_program_claims_nothing_on_the_cpu_clock(tmp_path, cpu_judge_config):
    """A 20 us program against itself: its calls run a fixed ~0.01 ms longer in the candidate's
    process (read 0.66-0.90x, some CIs under 0.80, before speedup.CPU_CALL_FLOOR_MS and
    stats.cpu_protocol_ci), which the floor and the interval cover: the verdict says neither faster
    nor slower, and its interval includes 1.0."""
    from cudal1.harness import evaluate_pairs
    from cudal1.speedup import CPU_CALL_FLOOR_MS, faster, slower
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate, Status

    task = load_task_file(REPO / "tests/fixtures/cpu_tasks/tiny_add.py")
    source = task.source.replace("class Model(", "class ModelNew(")
    config = cpu_judge_config(tmp_path / "cache", timing_trials=100, min_timing_trials=10, timing_budget_s=4.0,
                              bootstrap_samples=1000)  # the default judge's timing: a CI narrow enough to claim
    (r,) = evaluate_pairs([(task, Candidate(source, task_hash=task.hash))], config)
    assert r.status is Status.OK, r.message
    assert r.reference.median_ms < 1.0 and "cpu_timing" in r.flags
    # the floor covers the handoff's cost per call here (unit test: test_stats.py, the floor itself)
    assert abs(r.candidate.median_ms - r.reference.median_ms) < CPU_CALL_FLOOR_MS, (r.reference, r.candidate)
    assert not faster(r) and not slower(r), (r.speedup, r.speedup_ci, r.reference.median_ms, r.candidate.median_ms)
    # and its interval covers the handoff's cost per call (stats.cpu_protocol_ci): it includes 1.0
    # (without that: a top of 0.84 at most), or the verdict says the host was contended (issue 36's
    # rule; beside two other test processes on two cores one read 0.30-0.85, contended)
    lo, hi = r.speedup_ci
    assert "contended" in r.flags or lo <= 1.0 <= hi, (r.speedup, r.speedup_ci, r.flags)


@pytest.mark.cpu
def test_the_judges_processes_keep_idle_openmp_threads_asleep(tmp_path, cpu_judge_config):
    """Both processes of a job come from a forkserver started with OMP_WAIT_POLICY=PASSIVE (unless
    the caller set it): a spinning OpenMP pool in the reference worker took a core from the
    candidate on a small host (an identical program read 0.23x on two cores)."""
    from cudal1.harness import evaluate_pairs
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate, Status

    if os.environ.get("OMP_WAIT_POLICY"):
        pytest.skip("the caller chose an OpenMP wait policy")
    task = load_task_file(REPO / "tests/fixtures/small_tasks/diag_matmul.py")
    source = textwrap.dedent("""
        import os
        import torch.nn as nn

        POLICY = os.environ.get("OMP_WAIT_POLICY")


        class ModelNew(nn.Module):
            def forward(self, A, B):
                assert POLICY == "PASSIVE", POLICY
                return A.unsqueeze(1) * B
    """)
    (r,) = evaluate_pairs([(task, Candidate(source, task_hash=task.hash))], cpu_judge_config(tmp_path / "cache"))
    assert r.status is Status.OK, r.message
    assert "OMP_WAIT_POLICY" not in os.environ  # this process's environment is left as it was


@pytest.mark.cpu
def test_minus_v_shows_each_phase_of_a_job_as_it_starts(tmp_path):
    """``cudal1 judge -v`` logs the job's phases live (logger ``cudal1.judge``), not only the
    verdict's summary afterwards."""
    config = tmp_path / "small.yaml"
    config.write_text(small_config())  # the phases are the default config's; their trials fewer
    done = subprocess.run([sys.executable, "-m", "cudal1.cli.main", "judge", "-v", "--device", "cpu",
                           "--reference", str(REPO / "tests/fixtures/small_tasks/diag_matmul.py"),
                           "--candidate", str(REPO / "examples/candidates/diag_matmul_broadcast.py"),
                           "--config", str(config)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src"), "CUDAL1_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    live = [line for line in done.stderr.splitlines() if "cudal1.judge:" in line]
    phases = [line.split(": ")[-1].split(" ")[0] for line in live]
    assert phases[:5] == ["reference", "import", "construct", "correctness", "timing"], live
    assert "verdict ok" in live[-1], live
