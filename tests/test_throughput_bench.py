"""benchmarks/throughput.py without a GPU: the mixed set it builds (>= 50 pairs of the three
kinds over KernelBench tasks, from local files only), and its table over a finished run's JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "throughput.py"


@pytest.mark.cpu
def test_the_mixed_set_has_fifty_pairs_of_every_kind(shared_dir, tmp_path):
    kb, l1 = shared_dir / "kernelbench" / "kernelbench.jsonl", shared_dir / "cuda-l1" / "h100.jsonl"
    if not (kb.is_file() and l1.is_file()):
        pytest.skip("KernelBench / CUDA-L1 copies absent")
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path), "--kernelbench", str(kb),
                           "--cuda-l1", str(l1)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "set.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in rows}
    assert len(rows) >= 50 and {"cuda-l1", "cuda", "triton", "rename", "compile"} <= kinds
    assert all(
        "load_inline" in r["code"] or "cpp_extension" in r["code"] for r in rows if r["kind"] in ("cuda-l1", "cuda")
    )
    assert all("@triton.jit" in r["code"] and "ModelNew" in r["code"] for r in rows if r["kind"] == "triton")
    assert all(r["level"] in (1, 2) for r in rows)


def test_table_reads_a_run(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import throughput

    args = throughput.parse_args(["--out", str(tmp_path), "--workers", "16"])
    parent = throughput.Parent(args)
    batch = {
        "idle_share": 0.125, "lane_startup_s": 30.0, "builds": 26, "build_queue_s": 10.0, "build_s": 900.0,
        "judge_s": 200.0,
    }
    parent.mixed = [{"workers": 16, "pairs": 53, "passes": [
        {"name": "fresh", "complete": True, "wall_s": 240.0, "judged": 53, "candidates_per_gpu_hour": 795.0,
         "statuses": {"ok": 50, "incorrect": 3}, "batch": batch},
        {"name": "store", "complete": True, "wall_s": 0.5, "judged": 53, "candidates_per_gpu_hour": None,
         "statuses": {"ok": 50, "incorrect": 3}, "batch": None}]}]
    text = parent.table()
    assert "795" in text and "12%" in text and "480.0x" in text and "ok=50" in text
    parent.scratch.rmdir()
