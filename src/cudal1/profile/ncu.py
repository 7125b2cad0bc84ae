"""Nsight Compute's metrics for one call of a program (``--profile ncu``), where ``ncu`` runs.

Contract: :func:`ncu_problem` says in one line why ``ncu`` cannot run here (no CUDA device, no
``ncu`` on ``PATH`` or ``$CUDAL1_NCU``), or "" when it can.  :func:`run_ncu` profiles one call of
a task's reference (or of a candidate file) in a fresh process (:mod:`cudal1.profile.ncu_target`:
warm-up calls, then one call between ``cudaProfilerStart``/``Stop``) and returns
:class:`~cudal1.profile.model.NcuMetrics` (SM and DRAM throughput, achieved occupancy, the top
stall reasons), or a one-line reason as a string.

Limits: that process is not the judge's sandbox; ncu needs the program in a process it starts,
so the program runs unconfined, as ``python FILE`` would.  Only the CLI offers it, on files the
user names (``cudal1 judge``/``cudal1 profile``); the optimizer never runs generated code under
ncu.  ncu replays each kernel many times (seconds per kernel): use it on one program, not a suite.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys

from cudal1.profile.model import NcuMetrics

METRICS = {
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy",
}
DURATION = "gpu__time_duration.sum"  # each kernel's weight in the averages
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
TOP_STALLS = 3


def ncu_binary() -> str | None:
    return os.environ.get("CUDAL1_NCU") or shutil.which("ncu")


def ncu_problem(cuda_available: bool | None = None) -> str:
    """Why ncu cannot run here, in one line; "" when it can."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        return "ncu: no CUDA device here (Nsight Compute profiles GPU kernels only)"
    if not ncu_binary():
        return "ncu: Nsight Compute's 'ncu' is not on PATH (install Nsight Compute or set CUDAL1_NCU)"
    return ""


def run_ncu(task_path: str, candidate_path: str | None = None, timeout_s: float = 600.0) -> NcuMetrics | str:
    """Nsight Compute's metrics for one call (see the module docstring), or why there are none."""
    problem = ncu_problem()
    if problem:
        return problem
    metrics = ",".join([DURATION, *METRICS, f"regex:{STALL_PREFIX}.*{STALL_SUFFIX.replace('.', '[.]')}"])
    cmd = [ncu_binary(), "--csv", "--page", "raw", "--profile-from-start", "off", "--target-processes", "all",
           "--metrics", metrics, sys.executable, "-m", "cudal1.profile.ncu_target", task_path]
    if candidate_path:
        cmd.append(candidate_path)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"ncu: no result within {timeout_s:.0f} s"
    except OSError as exc:
        return f"ncu: could not start: {exc}"
    if "ERR_NVGPUCTRPERM" in proc.stdout + proc.stderr:
        return "ncu: no permission to read the GPU's performance counters here (ERR_NVGPUCTRPERM)"
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"ncu: exited with {proc.returncode}: {last[0][:200]}"
    return parse_csv(proc.stdout)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_csv(text: str) -> NcuMetrics | str:
    """ncu's ``--csv --page raw`` output (a header row, a units row, a row per kernel) as
    :class:`NcuMetrics`: each figure averaged over the kernels, weighted by duration where ncu
    reports it; stall reasons summed the same way, top :data:`TOP_STALLS` kept."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line or line.startswith('"ID"')), None)
    if start is None:
        return "ncu: no kernel was profiled (nothing ran between cudaProfilerStart and Stop)"
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    rows = [r for r in rows if _number(r.get("ID", "") or "") is not None]  # drops the units row
    if not rows:
        return "ncu: no kernel was profiled"
    weights = [(_number(r.get(DURATION, "") or "") or 1.0) for r in rows]
    total = sum(weights)
    out = NcuMetrics(kernels=len(rows))
    for metric, attr in METRICS.items():
        vals = [(_number(r.get(metric, "") or ""), w) for r, w in zip(rows, weights)]
        vals = [(v, w) for v, w in vals if v is not None]
        if vals:
            setattr(out, attr, round(sum(v * w for v, w in vals) / sum(w for _, w in vals), 2))
    stalls: dict[str, float] = {}
    for r, w in zip(rows, weights):
        for key, value in r.items():
            if key and key.startswith(STALL_PREFIX) and key.endswith(STALL_SUFFIX):
                v = _number(value or "")
                if v is not None:
                    reason = key[len(STALL_PREFIX):-len(STALL_SUFFIX)]
                    stalls[reason] = stalls.get(reason, 0.0) + v * w / total
    out.stalls = [[k, round(v, 2)] for k, v in sorted(stalls.items(), key=lambda kv: -kv[1])[:TOP_STALLS] if v > 0]
    return out
