"""benchmarks/lease_order.py: both orders of the real lease in both scenarios, a few requests each
(the figures themselves are the script's to print, not a test's to time), and a bad argument."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "lease_order.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.cpu
def test_both_orders_run_both_scenarios_and_keep_their_figures(tmp_path):
    out = tmp_path / "order.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--workers", "2", "--jobs", "2", "--asks", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    for scenario in ("turns", "judge"):
        assert set(figures[scenario]) == {"any", "choices-first"}
    assert all(f["asks"] == 2 for f in figures["turns"].values())
    assert all(f["jobs"] == 4 and f["wall_s"] > 0 and 0 < f["held_share"] <= 1 for f in figures["judge"].values())
    assert "choices-first" in done.stdout and "autotuning" in done.stdout


@pytest.mark.cpu
def test_a_bad_argument_is_a_one_line_error():
    done = subprocess.run([sys.executable, str(SCRIPT), "--workers", "1"], capture_output=True, text=True,
                          timeout=120, env=ENV)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "--workers" in done.stderr
