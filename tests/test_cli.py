"""CPU tier: the ``cudal1`` command line, run as a real subprocess (``python -m cudal1.cli.main``).

Every subprocess gets ``CUDAL1_CACHE_DIR`` inside ``tmp_path`` and runs with ``cwd=tmp_path`` so
nothing is written into the repository.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cli_support import SMALL_DIAG, cli_env, descendants, last_json, run_cli, small_config, worker_running
from cudal1.cli.main import main as cli_main
from cudal1.store import RunStore

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "examples" / "tasks"
DIAG = SMALL_DIAG
CANDIDATES = REPO / "examples" / "candidates"
BROADCAST = CANDIDATES / "diag_matmul_broadcast.py"
ADDMM = CANDIDATES / "linear_relu_addmm.py"
FIXTURES = REPO / "tests" / "fixtures" / "cpu"
CONTRACT_KEYS = {"status", "correct", "speedup", "reference_ms", "candidate_ms", "flags", "message"}

SMALL_CONFIG = small_config(timeout_s=60.0)


@pytest.fixture(name="cli_env")
def _cli_env(tmp_path: Path) -> dict[str, str]:
    return cli_env(tmp_path / "cache")


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL_CONFIG)
    return path


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


# ---------------------------------------------------------------------------------------------
# eval


@pytest.mark.cpu
def test_eval_json_ok(judged_broadcast):
    proc = judged_broadcast  # judge --reference DIAG --candidate BROADCAST --config SMALL_CONFIG --json
    assert proc.returncode == 0, explain(proc)
    out = last_json(proc.stdout)
    assert CONTRACT_KEYS <= set(out)
    assert out["status"] == "ok", explain(proc)
    assert out["correct"] is True
    assert isinstance(out["speedup"], float) and out["speedup"] > 0
    assert isinstance(out["reference_ms"], float) and isinstance(out["candidate_ms"], float)
    assert "cpu_timing" in out["flags"]
    assert out["task"] == "diag_matmul"
    assert "Traceback" not in proc.stderr


@pytest.mark.cpu
def test_eval_json_incorrect(tmp_path, cli_env, config_file):
    proc = run_cli(
        ["judge", "--reference", DIAG, "--candidate", FIXTURES / "wrong.py", "--config", config_file, "--json"],
        cli_env,
        tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    out = last_json(proc.stdout)
    assert CONTRACT_KEYS <= set(out)
    assert out["status"] == "incorrect"
    assert out["correct"] is False
    assert out["speedup"] is None
    assert "value_mismatch" in out["flags"]
    assert out["message"]


@pytest.mark.cpu
def test_eval_text_output(tmp_path, cli_env, config_file):
    proc = run_cli(["judge", "--reference", DIAG, "--candidate", FIXTURES / "wrong_shape.py", "--config", config_file],
                   cli_env, tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "status      incorrect" in proc.stdout
    assert "shape_mismatch" in proc.stdout


# ---------------------------------------------------------------------------------------------
# bad usage: non-zero exit, one line 'cudal1: error: ...' on stderr, no traceback

NO_GET_INPUTS = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x


def get_init_inputs():
    return []
"""


def _bad_usage_cases(tmp: Path) -> dict[str, list]:
    ref_no_inputs = tmp / "no_get_inputs.py"
    ref_no_inputs.write_text(NO_GET_INPUTS)
    return {
        "missing-candidate": ["judge", "--reference", DIAG, "--candidate", tmp / "nope.py"],
        "missing-reference": ["judge", "--reference", tmp / "nope_ref.py", "--candidate", BROADCAST],
        "bad-device": ["judge", "--reference", DIAG, "--candidate", BROADCAST, "--device", "gpu"],
        "unknown-preset": ["judge", "--reference", DIAG, "--candidate", BROADCAST, "--preset", "no-such-preset"],
        "no-get-inputs": ["judge", "--reference", ref_no_inputs, "--candidate", BROADCAST, "--device", "cpu"],
    }


@pytest.mark.cpu
@pytest.mark.parametrize(
    "case", ["missing-candidate", "missing-reference", "bad-device", "unknown-preset", "no-get-inputs"]
)
def test_bad_usage(case, tmp_path, cli_env):
    args = _bad_usage_cases(tmp_path)[case]
    proc = run_cli(args, cli_env, tmp_path, timeout=120)
    assert proc.returncode != 0, explain(proc)
    assert "Traceback" not in proc.stderr, explain(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, explain(proc)
    assert lines[0].startswith("cudal1: error:"), explain(proc)
    assert proc.returncode == 2


REFUSE_ALL = """import json, sys
from cudal1.cli.main import main
seen = []
for args in json.loads(sys.argv[1]):
    rc = main(args)
    seen.append([" ".join(args[:2]), rc, "torch" in sys.modules])
print(json.dumps(seen))
"""


@pytest.mark.cpu
def test_every_command_refuses_bad_input_before_importing_the_judge(tmp_path, cli_env):
    """One process runs a bad-input case of every command in turn and says after each whether
    torch (the judge's first heavy import) was imported: none may import it, so each refusal
    costs only the interpreter's start (a fraction of a second, where the judge takes seconds)."""
    nope = str(tmp_path / "nope.py")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("judge: [unclosed\n")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    task = str(DIAG)
    cases = [["judge", "--reference", nope, "--candidate", nope], ["judge", "--reference", task, "--candidate", nope],
             ["optimize", nope], ["optimize", task, "--preset", "turbo"], ["optimize", task, "--passes", "nope"],
             ["optimize", task, "--config", str(bad_yaml)], ["optimize", task, "--out", str(a_file)],
             ["evaluate", nope, "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
             ["judge-suite", "--suite", nope, "--candidates", nope], ["verify", nope], ["baseline", "--suite", nope],
             ["collect", "--suite", task, "--from", nope], ["report", nope], ["analyze", nope],
             ["export", nope, "--format", "cuda-l1", "--out", str(tmp_path / "x.jsonl")], ["compare", nope, nope],
             ["train", "sft", "--out", str(tmp_path / "t"), "--config", nope]]
    done = subprocess.run([sys.executable, "-c", REFUSE_ALL, json.dumps(cases)], capture_output=True, text=True,
                          env=cli_env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, explain(done)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(name, rc, imported) for name, rc, imported in seen] == [(" ".join(c[:2]), 2, False) for c in cases], seen
    errors = done.stderr.strip().splitlines()
    assert len(errors) == len(cases) and all(e.startswith("cudal1: error: ") for e in errors), errors
    assert "known: default, fast, kernelbench-v0, thorough" in errors[3]  # an unknown preset lists the valid ones


def test_bad_usage_messages_name_the_fault(tmp_path, cli_env, capsys):
    """In-process: the messages say what is wrong (no subprocess, so these are cheap)."""
    cases = _bad_usage_cases(tmp_path)
    expected = {"missing-candidate": "nope.py", "missing-reference": "nope_ref.py", "unknown-preset": "no-such-preset",
                "no-get-inputs": "get_inputs"}
    for case, needle in expected.items():
        rc = cli_main([str(a) for a in cases[case]])
        err = capsys.readouterr().err
        assert rc == 2, case
        assert err.startswith("cudal1: error:") and needle in err, (case, err)


def test_judge_suite_bad_candidates_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "diag_matmul", "code": "x"}\nnot json\n')
    rc = cli_main(
        [
            "judge-suite", "--candidates", str(bad), "--suite", str(TASKS), "--out", str(tmp_path / "o"),
            "--device", "cpu",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("cudal1: error:") and ":2:" in err
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(json.dumps({"task": "no_such_task", "code": "class ModelNew: pass"}) + "\n")
    rc = cli_main(
        [
            "judge-suite", "--candidates", str(unknown), "--suite", str(TASKS), "--out", str(tmp_path / "o"),
            "--device", "cpu",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("cudal1: error:") and "no_such_task" in err


# ---------------------------------------------------------------------------------------------
# judge-suite: files, skip on re-run


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _evaluation_rows(db: Path) -> dict[str, tuple[int, float, str, str]]:
    """candidate_hash -> (id, created_at, config_hash, status), read with plain sqlite3."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute("SELECT candidate_hash, id, created_at, config_hash, status FROM evaluations").fetchall()
    finally:
        con.close()
    out: dict[str, tuple[int, float, str, str]] = {}
    for cand, *rest in rows:
        assert cand not in out, f"candidate {cand[:12]} evaluated under two configs"
        out[cand] = tuple(rest)
    return out


def _read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.cpu
def test_judge_suite_writes_store_and_results_and_skips_on_rerun(tmp_path, cli_env, config_file):
    cands = _write_jsonl(tmp_path / "cands.jsonl", [
        {"task": "diag_matmul", "code": BROADCAST.read_text(), "label": "broadcast"},
        {"task": "linear_relu", "code": ADDMM.read_text(), "label": "addmm"},
        {"task": "diag_matmul", "code": (FIXTURES / "wrong.py").read_text(), "label": "wrong"},
    ])
    out = tmp_path / "out"
    args = ["judge-suite", "--candidates", cands, "--suite", TASKS, "--out", out, "--config", config_file, "--json"]

    first = run_cli(args, cli_env, tmp_path)
    assert first.returncode == 0, explain(first)
    summary = last_json(first.stdout)
    assert summary["evaluated"] == 3
    assert summary["device"] == "cpu"
    assert (out / "cudal1.sqlite").is_file()
    assert (out / "results.jsonl").is_file()
    saved = yaml.safe_load((out / "config.yaml").read_text())  # the resolved configuration, next to summary.json
    assert (
        saved["judge"]["correctness_trials"] == 2 and saved["judge"]["tolerance"] == "exact"
    )  # the file, then defaults
    assert saved["run"]["device"] == "cpu" and saved["run"]["backend"] == "local"
    results = _read_results(out / "results.jsonl")
    assert [r["label"] for r in results] == ["broadcast", "addmm", "wrong"]
    assert [r["status"] for r in results] == ["ok", "ok", "incorrect"], [
        (r["status"], r["message"][:200]) for r in results
    ]
    assert [r["task"] for r in results] == ["diag_matmul", "linear_relu", "diag_matmul"]
    for r in results:
        assert CONTRACT_KEYS <= set(r)
    rows_before = _evaluation_rows(out / "cudal1.sqlite")
    assert len(rows_before) == 3

    with RunStore(out / "cudal1.sqlite") as store:
        assert sum(store.counts().values()) == 3
        assert store.counts() == {"ok": 2, "incorrect": 1}

    second = run_cli(args, cli_env, tmp_path)
    assert second.returncode == 0, explain(second)
    assert _read_results(out / "results.jsonl") == results
    assert _evaluation_rows(out / "cudal1.sqlite") == rows_before  # nothing re-evaluated or re-recorded
    again = last_json(second.stdout)
    assert again["statuses"] == summary["statuses"]
    assert summary["batch"] is not None and again["batch"] is None  # the second run judged nothing
    assert "resuming: 3 already judged" in second.stderr and "resuming" not in first.stderr
    with RunStore(out / "cudal1.sqlite") as store:
        assert store.get_run(1)["status"] == "done" and store.get_run(2)["status"] == "done"


# ---------------------------------------------------------------------------------------------
# resume after SIGKILL


def _started_with_env(name: str, value: str) -> list[int]:
    """Processes whose initial environment has ``name=value`` (a value unique to one test)."""
    needle = f"{name}={value}".encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _count_evaluations(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return int(con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return 0


@pytest.mark.cpu
def test_resume_after_kill(tmp_path, cli_env, config_file):
    cands = _write_jsonl(tmp_path / "cands.jsonl", [
        # quick-1 is a small task with a ~1x speedup: every phase stays well under the re-run's limit
        {"task": "linear_relu", "code": ADDMM.read_text(), "label": "quick-1"},
        {"task": "diag_matmul", "code": (FIXTURES / "hang.py").read_text(), "label": "hang"},
        {"task": "diag_matmul", "code": (FIXTURES / "wrong_shape.py").read_text(), "label": "quick-2"},
    ])
    out = tmp_path / "out"
    db = out / "cudal1.sqlite"
    base = ["judge-suite", "--candidates", cands, "--suite", TASKS, "--out", out, "--config", config_file, "--json"]

    proc = subprocess.Popen([sys.executable, "-m", "cudal1.cli.main", *map(str, base), "--timeout", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env, cwd=tmp_path,
                            start_new_session=True)
    spawned: list[int] = []
    try:
        deadline = time.monotonic() + 180
        # Wait until the first verdict is recorded and the hanging candidate's worker is running.
        while _count_evaluations(db) < 1 or not worker_running(proc.pid):
            assert proc.poll() is None, f"judge-suite exited early: rc={proc.returncode} {proc.communicate()}"
            assert time.monotonic() < deadline, "no evaluation recorded / no worker running within 180 s"
            time.sleep(0.1)
        time.sleep(0.3)
        spawned = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
        # Workers run in their own session (setsid), so the group kill does not reach them and a
        # hung one would live on: end every process this CLI started, by id.
        time.sleep(0.2)
        for pid in set(spawned) | set(_started_with_env("CUDAL1_CACHE_DIR", cli_env["CUDAL1_CACHE_DIR"])):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    assert proc.returncode == -signal.SIGKILL

    with RunStore(db) as store:  # reopens cleanly after the kill
        survived = store.evaluations()
        assert len(survived) == 1, [r.status for r in survived]  # killed while the 2nd one hung
        assert survived[0].status.value == "ok"
    before = _evaluation_rows(db)
    (first_hash, (first_id, first_created, first_config, _)), = before.items()

    # a phase limit the honest candidates stay far below even on a loaded machine; the hanging one reaches it
    rerun = run_cli([*base, "--timeout", "10"], cli_env, tmp_path)
    assert rerun.returncode == 0, explain(rerun)
    results = _read_results(out / "results.jsonl")
    assert [r["label"] for r in results] == ["quick-1", "hang", "quick-2"]
    assert [r["status"] for r in results] == ["ok", "timeout", "incorrect"], [
        (r["status"], r["message"][:300]) for r in results
    ]
    assert results[0]["candidate_hash"] == first_hash

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute("SELECT candidate_hash, id, created_at, config_hash FROM evaluations ORDER BY id").fetchall()
    finally:
        con.close()
    assert {r[0] for r in rows} == {r["candidate_hash"] for r in results}  # all candidates recorded
    first_rows = [r for r in rows if r[0] == first_hash]
    assert (first_id, first_created, first_config) in [tuple(r[1:]) for r in first_rows]  # the survivor is intact
    assert len(first_rows) == 1


# ---------------------------------------------------------------------------------------------
# baseline


@pytest.mark.cpu
def test_baseline_eager_cpu(tmp_path, cli_env, config_file):
    proc = run_cli(["baseline", "--suite", DIAG, "--modes", "eager", "--device", "cpu", "--json",
                    "--out", tmp_path / "baselines", "--config", config_file], cli_env, tmp_path)
    assert proc.returncode == 0, explain(proc)
    out = last_json(proc.stdout)
    assert out["device"] == "cpu"
    (task,) = out["tasks"]
    assert task["task"] == "diag_matmul"
    assert isinstance(task["eager_ms"], float) and task["eager_ms"] > 0
    eager = task["modes"]["eager"]
    assert eager["status"] == "ok", eager
    assert eager["reference_ms"] == task["eager_ms"]
    assert (tmp_path / "baselines" / "cudal1.sqlite").is_file()
    saved = yaml.safe_load((tmp_path / "baselines" / "config.yaml").read_text())
    assert saved["run"]["modes"] == ["eager"] and set(saved["judge"]) >= {"tolerance", "correctness_trials"}


def test_baseline_unknown_mode(tmp_path, cli_env, capsys):
    rc = cli_main(["baseline", "--suite", str(DIAG), "--modes", "eager,warp-speed", "--device", "cpu",
                   "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("cudal1: error:") and "warp-speed" in err


def test_optimize_builtin_passes_flag(tmp_path, capsys):
    rc = cli_main(["optimize", str(DIAG), "--policy", "builtin", "--passes", "algebraic,warp-drive", "--device", "cpu",
                   "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("cudal1: error:") and "warp-drive" in err and len(err.strip().splitlines()) == 1
    rc = cli_main(["optimize", str(DIAG), "--policy", "replay", "--replay", str(DIAG), "--passes", "algebraic",
                   "--device", "cpu", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "--passes applies to --policy builtin only" in err


def test_the_judging_commands_have_distinct_names_and_keep_the_old_ones():
    """``judge`` (one candidate), ``judge-suite`` (a file of them) and ``evaluate`` (a model); the
    names of cudal1 0.1, ``eval`` and ``eval-suite``, run the same commands."""
    from cudal1.cli.main import build_parser

    parser = build_parser()
    args = ["--reference", "r.py", "--candidate", "c.py"]
    assert parser.parse_args(["eval", *args]).func is parser.parse_args(["judge", *args]).func
    suite = ["--candidates", "c.jsonl", "--suite", "s"]
    assert parser.parse_args(["eval-suite", *suite]).func is parser.parse_args(["judge-suite", *suite]).func
    assert parser.parse_args(["judge", *args]).func is not parser.parse_args(["judge-suite", *suite]).func
