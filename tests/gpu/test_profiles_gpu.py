"""GPU tests of measured profiles (``judge --profile``): CUPTI kernels in both judge processes.

Covered: an honest candidate profiled in its confined, sealed process keeps its ``ok`` verdict
(CUPTI trips no guard); a one-kernel program's profiled kernel time is within 5% of the judge's
GPU figure, with CUDA kernel names, grid, block and registers; a two-kernel program lists two
kernels; ``ncu`` either adds its metrics or says in one line why it cannot; profiling adds at most
0.5 s median per verdict.  Every test is marked ``gpu`` (skipped without CUDA).  Run::

    python -m pytest tests/gpu/test_profiles_gpu.py -q
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from cudal1.config import EvalConfig
from cudal1.recorded import RecordedJudge
from cudal1.tasks import load_task_file
from cudal1.types import Candidate, EvalResult, Status, reference_candidate

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
CONFIG = EvalConfig(device="cuda", profile="cupti", correctness_trials=2, timing_trials=30, min_timing_trials=10,
                    timing_budget_s=1.0)

MATMUL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """One cuBLAS GEMM of about 2 ms on an H200 (fp32, TF32 off under strict math mode)."""

    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]


def get_init_inputs():
    return []
'''

TWO_KERNELS = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Two elementwise kernels in eager mode: exp, then a multiply."""

    def forward(self, x):
        return torch.exp(x) * 3.0


def get_inputs():
    return [torch.randn(64 * 1024 * 1024)]


def get_init_inputs():
    return []
'''


def _judge(tmp_path: Path, source: str, name: str, config: EvalConfig = CONFIG, candidate: str | None = None):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    task = load_task_file(path)
    cand = Candidate(candidate, task_hash=task.hash) if candidate else reference_candidate(task)
    (result,) = RecordedJudge(config.replace(cache_dir=str(tmp_path / "cache")), None).judge([(task, cand)])
    return result, path


def _why(r: EvalResult) -> str:
    return f"status={r.status.value} flags={r.flags} message={r.message[-2000:]} log={r.stderr_tail[-2000:]}"


def test_one_kernel_matches_the_judges_gpu_time_and_carries_cupti_fields(tmp_path):
    candidate = MATMUL.replace("class Model(", "class ModelNew(")
    r, _ = _judge(tmp_path, MATMUL, "matmul", candidate=candidate)
    assert r.status is Status.OK, _why(r)  # profiling in the sealed candidate process tripped no guard
    assert r.profile is not None, _why(r)
    for p in (r.profile.reference, r.profile.candidate):
        assert p.ok and p.device == "cuda", p
        main = p.kernels[0]
        assert main.share > 0.95 and not main.name.startswith("aten::"), p.kernels
        assert main.grid and main.block and len(main.grid) == 3 and isinstance(main.registers, int), main
        assert p.bound is not None and p.bound.value == "compute-bound", p
        assert p.bandwidth_share is not None and 0 < p.bandwidth_share < 1  # peak read from the device
    judged_us = r.reference_ms * 1e3
    profiled_us = r.profile.reference.busy_us
    assert abs(profiled_us - judged_us) / judged_us <= 0.05, (profiled_us, judged_us)


def test_two_kernel_program_lists_two_kernels(tmp_path):
    candidate = TWO_KERNELS.replace("class Model(", "class ModelNew(")
    r, _ = _judge(tmp_path, TWO_KERNELS, "two_kernels", candidate=candidate)
    assert r.status is Status.OK and r.profile is not None, _why(r)
    for p in (r.profile.reference, r.profile.candidate):
        assert len(p.kernels) == 2 and p.launches == 2, [(k.name, k.launches) for k in p.kernels]
        assert p.bound is not None and p.bound.value == "memory-bound", p


def test_ncu_works_or_says_why(tmp_path):
    task = tmp_path / "two_kernels.py"
    task.write_text(TWO_KERNELS)
    proc = subprocess.run([sys.executable, "-m", "cudal1.cli.main", "profile", str(task), "--tool", "ncu", "--json",
                           "--device", "cuda"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    ref = out["profile"]["reference"]
    if ref["ncu"] is not None:
        assert out["profile"]["tool"] == "ncu" and ref["ncu"]["kernels"] >= 2
        assert ref["ncu"]["sm_throughput"] is not None and ref["ncu"]["dram_throughput"] is not None
    else:
        lines = [line for line in proc.stderr.splitlines() if "ncu" in line]
        assert len(lines) == 1 and lines[0].startswith("cudal1: ncu: "), proc.stderr[-3000:]
        assert "ncu: " in ref["note"]


@pytest.mark.slow
def test_profiling_adds_at_most_half_a_second_per_verdict(tmp_path):
    """Alternating judged verdicts of the bundled example with profiling on and off (after one
    warm-up of each): the median wall with profiling is at most 0.5 s above the median without."""
    task = load_task_file(REPO / "examples" / "tasks" / "diag_matmul.py")
    cand = Candidate((REPO / "examples" / "candidates" / "diag_matmul_broadcast.py").read_text(), task_hash=task.hash)
    walls: dict[str, list[float]] = {"cupti": [], "off": []}
    for i in range(8):
        mode = "cupti" if i % 2 else "off"
        config = CONFIG.replace(profile=mode, cache_dir=str(tmp_path / "cache"), input_seed=1000 + i)
        (r,) = RecordedJudge(config, None).judge([(task, cand)])
        assert r.status is Status.OK, _why(r)
        assert (r.profile is not None) == (mode == "cupti")
        if i >= 2:
            walls[mode].append(r.wall_s)
    extra = statistics.median(walls["cupti"]) - statistics.median(walls["off"])
    assert extra <= 0.5, walls
