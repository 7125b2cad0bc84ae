"""benchmarks/call_blocking.py: the suspect lines of Inductor's generated code, and the parent's
plumbing (one process per program, a row per program, the table) with a program that cannot run
on this machine (no CUDA here): its row says why instead of stopping the rest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "call_blocking.py"
sys.path.insert(0, str(REPO / "benchmarks"))


import call_blocking  # noqa: E402


def test_generated_code_names_lines_that_may_wait_for_the_device(tmp_path):
    code = tmp_path / "inductor" / "ab" / "cabc.py"
    code.parent.mkdir(parents=True)
    code.write_text("buf0 = empty_strided_cuda((4,), (1,), torch.float32)\n"
                    "# torch.cuda.synchronize() in a comment\n"
                    "desc = create_2d_tma_descriptor(buf0, 4, 4, 4, 4, 4)\n"
                    "n = int(buf1.item())\n")
    hits = call_blocking.generated_code(tmp_path / "inductor")
    assert [h.split(":")[1] for h in hits] == ["3", "4"]
    assert call_blocking.generated_code(tmp_path / "absent") == []


@pytest.mark.cpu
def test_each_program_gets_a_row_and_one_that_cannot_run_says_why(tmp_path):
    out = tmp_path / "rows.json"
    task = REPO / "examples" / "tasks" / "diag_matmul.py"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(task), "--modes", "eager,compile-default",
                           "--parallel", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert sorted(r["mode"] for r in rows) == ["compile-default", "eager"]
    for row in rows:  # no CUDA on this machine: each program's own error, the table still printed
        assert "CUDA" in row["error"] and row["code"] == []
    assert "error:" in proc.stdout and proc.stdout.splitlines()[0].startswith("task")
