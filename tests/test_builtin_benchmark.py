"""benchmarks/builtin_kernelbench.py end to end on the CPU: selection rules recorded per task,
the search, the re-timing of winners (``--confirm``) and a report recomputed from the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli_support import SMALL_DIAG

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "builtin_kernelbench.py"
TASK = SMALL_DIAG


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDAL1_CACHE_DIR=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)


def test_benchmark_selects_searches_confirms_and_reports(tmp_path):
    out = tmp_path / "kb"
    done = run([str(TASK), "--subset", "stride:3", "--subset", "algebraic", "--rounds", "1", "--samples", "1",
                "--device", "cpu", "--out", str(out), "--confirm"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "tasks.txt").read_text().split() == ["diag_matmul", "stride:3,algebraic"]
    report = json.loads((out / "report.json").read_text())
    assert report["success"] == 1 and report["unfinished"] == []
    row = report["rows"][0]
    # how much faster depends on the machine's load; that the algebraic rewrite won, verified and
    # re-timed, does not (it is the only builtin candidate of one CPU round)
    assert row["best_passes"] == "algebraic" and row["best"] > 0
    assert row["best_confirmed"]["status"] == "ok" and row["best_confirmed"]["speedup"] > 0
    assert report["confirmed"]["best"]["n"] == 1 and report["confirmed"]["failed"] == []
    confirmations = json.loads((out / "confirm.json").read_text())
    assert list(confirmations) == [f"diag_matmul|{row['best_hash']}"]
    assert "re-timed with fresh inputs" in (out / "report.md").read_text()
    page = (out / "report.html").read_text()  # the general report of the same store
    assert "diag_matmul" in page and "<svg" in page
    # the report is recomputed from the store and the confirmations alone, judging nothing
    again = run([str(TASK), "--device", "cpu", "--out", str(out), "--report-only"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "report.json").read_text())["rows"][0]["best_confirmed"] == row["best_confirmed"]
