"""A judging run stopped from outside (Ctrl-C, or SIGTERM from a scheduler or `timeout`) exits
promptly with code 130 and one line, keeps every verdict recorded so far, and the same command
resumes with the rest (the real CLI and judge subprocesses, on the CPU)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_support import SMALL_DIAG, cli_env, small_config, worker_running

pytestmark = pytest.mark.cpu  # starts processes: the CPU tier (tests/tiers.py)

REPO = Path(__file__).resolve().parents[1]
N = 4


def recorded(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


def _default_sigint() -> None:  # a child of a non-interactive shell may inherit SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_run_keeps_its_verdicts_and_resumes(tmp_path, sig):
    source = (REPO / "examples" / "candidates" / "diag_matmul_broadcast.py").read_text()
    slow = tmp_path / "slow"  # while it exists, every candidate but the first hangs in its import
    slow.touch()
    hang = f"\nimport os as _os, time as _time\nif _os.path.exists({str(slow)!r}):\n    _time.sleep(300)\n"
    cands = tmp_path / "cands.jsonl"
    cands.write_text(
        "".join(
            json.dumps(
                {"task": "diag_matmul", "code": f"{source}\n# variant {i}\n" + (hang if i else ""), "label": f"v{i}"}
            )
            + "\n"
            for i in range(N)
        )
    )
    (tmp_path / "judge.yaml").write_text(small_config())
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "cudal1.cli.main", "judge-suite", "--candidates", str(cands), "--suite",
           str(SMALL_DIAG), "--config", str(tmp_path / "judge.yaml"), "--out", str(out)]
    env = cli_env(tmp_path / "cache")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=_default_sigint)
    deadline = time.monotonic() + 180
    while recorded(out / "cudal1.sqlite") < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "the run finished before it could be stopped"
    while not worker_running(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the first verdict is in: the next worker runs a candidate that hangs for 300 s
    assert worker_running(proc.pid), "no worker running after the first verdict"
    proc.send_signal(sig)  # the stop must kill that worker, not wait for it
    _, err = proc.communicate(timeout=120)  # well before the hanging import could end by itself
    assert proc.returncode == 130, err[-2000:]
    assert "cudal1: interrupted (results recorded so far are kept)" in err
    assert "Traceback" not in err
    kept = recorded(out / "cudal1.sqlite")
    assert kept == 1, f"{kept} verdicts kept"
    with sqlite3.connect(out / "cudal1.sqlite") as con:  # a worker killed by the stop left no verdict
        assert {row[0] for row in con.execute("SELECT status FROM evaluations")} == {"ok"}
    if sig == signal.SIGINT:
        return  # resuming does not depend on the signal that stopped the run: checked once, after SIGTERM
    slow.unlink()
    again = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert recorded(out / "cudal1.sqlite") == N  # the kept verdicts were not judged again
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == N and {r["status"] for r in rows} == {"ok"}


def test_sigusr1_drains_the_run_the_running_verdict_finishes_and_is_kept(tmp_path):
    source = (REPO / "examples" / "candidates" / "diag_matmul_broadcast.py").read_text()
    # every candidate but the first takes 4 s in its import: the drain must wait for it, not kill it
    pause = "\nimport time as _time\n_time.sleep(4)\n"
    cands = tmp_path / "cands.jsonl"
    cands.write_text("".join(json.dumps({"task": "diag_matmul", "code": f"{source}\n# variant {i}\n"
                                         + (pause if i else ""), "label": f"v{i}"}) + "\n" for i in range(N)))
    (tmp_path / "judge.yaml").write_text(small_config())
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "cudal1.cli.main", "judge-suite", "--candidates", str(cands), "--suite",
           str(SMALL_DIAG), "--config", str(tmp_path / "judge.yaml"), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(tmp_path / "cache"), cwd=tmp_path, preexec_fn=_default_sigint)
    deadline = time.monotonic() + 180
    while recorded(out / "cudal1.sqlite") < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    while not worker_running(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker_running(proc.pid), "no worker running after the first verdict"
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "cudal1: draining" in err and "cudal1: drained (results recorded so far are kept)" in err
    assert "Traceback" not in err
    with sqlite3.connect(out / "cudal1.sqlite") as con:  # the running one finished; no other started
        assert [row[0] for row in con.execute("SELECT status FROM evaluations")] == ["ok", "ok"]
