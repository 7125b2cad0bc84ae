"""What the CLI and judge tests share (a helper module, not a test file): the small copy of the
bundled task, the small CPU judge config, a ``cudal1`` subprocess runner, and reading the last
JSON line of its stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# examples/tasks/diag_matmul.py at N = M = 512, same task name: the same verdicts for an eighth of
# the reference's work (its float64 re-runs included), so the heavy judge tests use it.
SMALL_DIAG = Path(__file__).resolve().parent / "fixtures" / "small_tasks" / "diag_matmul.py"


def small_config(timeout_s: float = 60.0) -> str:
    """A fast CPU judge config for end-to-end CLI runs (YAML text)."""
    return ("device: cpu\ncorrectness_trials: 2\ntiming_trials: 20\nmin_timing_trials: 5\ntiming_budget_s: 0.5\n"
            f"bootstrap_samples: 200\ntimeout_s: {timeout_s}\n")


def cli_env(cache_dir: Path) -> dict[str, str]:
    """The environment of a CLI subprocess: its own cache, unbuffered output, no debug tracebacks."""
    env = dict(os.environ, CUDAL1_CACHE_DIR=str(cache_dir), PYTHONUNBUFFERED="1")
    env.pop("CUDAL1_DEBUG", None)
    return env


def run_cli(args: list, env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cudal1.cli.main", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def last_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "no output on stdout"
    return json.loads(lines[-1])


# ---- the processes a CLI run started (Linux /proc) --------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    children = _children_map()
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def worker_running(pid: int) -> bool:
    """Whether ``pid`` has a live descendant in its own session: a judge worker (they call setsid),
    i.e. a candidate job in flight."""
    for child in descendants(pid):
        try:
            if os.getsid(child) == child and alive(child):
                return True
        except OSError:
            continue
    return False
