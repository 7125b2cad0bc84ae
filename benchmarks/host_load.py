#!/usr/bin/env python
"""Does host-CPU load move launch-bound timings?  (It does: see benchmarks/LOG.md, 2026-12-01.)

Why: in the H200 release runs, launch-bound records (unrolled GRUs/LSTMs whose candidates replay
a CUDA graph: level3/35, 39-42; level1/71) measured 17-57% higher speedups when builds and a
second worker shared the host than on a quiet one.  A reference that launches hundreds of small
kernels is timed through its host thread; a graph replay is not, so host contention slows the
reference and inflates the speedup.  This script judges the same records (warm caches, one fixed
input seed, one worker, one GPU) in three scenarios and prints each record's reference time and
speedup per scenario:

``quiet``    nothing else running
``load``     one busy-looping process per CPU of the affinity mask (what a full build farm does)
``quiet2``   quiet again: how far two quiet runs drift apart

The first pass (``warm``, not reported) fills the build and compiler caches.  ``--smoke`` runs
the bundled diag_matmul example on the CPU to check the script.  Output: ``--out/host_load.json``
(written after every scenario) and a table printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAUNCH_BOUND = ("level3/35", "level3/39", "level3/40", "level3/41", "level3/42", "level1/71")
SCENARIOS = ("quiet", "load", "quiet2")


def jobs_of(args: argparse.Namespace) -> list[Any]:
    from cudal1.harness.parent.api import Job
    from cudal1.releases import candidates_of, read_records
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate

    if args.smoke:
        task = load_task_file(ROOT / "examples" / "tasks" / "diag_matmul.py")
        code = (ROOT / "examples" / "candidates" / "diag_matmul_broadcast.py").read_text()
        return [Job(task, Candidate(code, task_hash=task.hash, label="diag_matmul"))]
    keep = set(args.records.split(","))
    records = [r for r in read_records(args.file) if r.key in keep]
    missing = keep - {r.key for r in records}
    if missing:
        sys.exit(f"host_load: records not in {args.file}: {', '.join(sorted(missing))}")
    return [Job(t, c) for _, t, c in candidates_of(records)]


def start_load(n: int) -> list[subprocess.Popen]:
    """``n`` busy-looping processes."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def judge(jobs: list[Any], args: argparse.Namespace) -> list[Any]:
    from cudal1.config import EvalConfig
    from cudal1.harness.parent.api import DevicePlan, run_jobs

    cfg = EvalConfig(device=args.device, cache_dir=args.cache, input_seed=1234, workers_per_gpu=1)
    plan = DevicePlan.detect(args.device)
    plan = DevicePlan(plan.device, plan.lanes[:1], plan.arch_list, plan.driver)
    return run_jobs(jobs, cfg, plan=plan)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--file", default=str(ROOT.parent / "shared" / "cuda-l1" / "h100.jsonl"), help="CUDA-L1 release JSONL"
    )
    p.add_argument("--records", default=",".join(LAUNCH_BOUND), help="record keys (levelL/ID), comma-separated")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="runs/host_load")
    p.add_argument("--smoke", action="store_true", help="CPU check of the script on the bundled example")
    args = p.parse_args(argv)
    if args.smoke:
        args.device = "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.cache = str(out / "cache")
    jobs = jobs_of(args)
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    print(f"host_load: {len(jobs)} record(s), {len(cpus)} CPUs", flush=True)
    t0 = time.monotonic()
    judge(jobs, args)  # warm: builds, Inductor/Triton caches
    print(f"warm-up {time.monotonic() - t0:.0f} s", flush=True)
    rows: dict[str, dict[str, Any]] = {}
    for scenario in SCENARIOS:
        load = start_load(len(cpus)) if scenario == "load" else []
        try:
            t = time.monotonic()
            results = judge(jobs, args)
        finally:
            stop_load(load)
        print(f"{scenario}: {time.monotonic() - t:.0f} s", flush=True)
        for job, r in zip(jobs, results):
            rows.setdefault(job.candidate.label, {})[scenario] = {
                "status": r.status.value, "reference_ms": r.reference_ms, "candidate_ms": r.candidate_ms,
                "speedup": r.speedup,
            }
        (out / "host_load.json").write_text(json.dumps({"cpus": len(cpus), "records": rows}, indent=1))
        print(json.dumps({label: by[scenario] for label, by in rows.items()}), flush=True)

    def cell(d: dict[str, Any]) -> str:
        if d.get("speedup") is None:
            return d["status"]
        return f"{d['reference_ms']:.3f}ms {d['speedup']:.2f}x"

    print("\nrecord | " + " | ".join(SCENARIOS) + " | load/quiet | quiet2/quiet")
    ratios: dict[str, list[float]] = {"load": [], "quiet2": []}
    for label, by in rows.items():
        line = [label] + [cell(by[s]) for s in SCENARIOS]
        for s in ratios:
            a, b = by["quiet"]["speedup"], by[s]["speedup"]
            ratio = b / a if a and b else None
            if ratio:
                ratios[s].append(ratio)
            line.append(f"{ratio:.3f}" if ratio else "-")
        print(" | ".join(line))
    for s, xs in ratios.items():
        if xs:
            print(f"{s}/quiet speedup ratio: median {statistics.median(xs):.3f}, max {max(xs):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
