#!/usr/bin/env python
"""What ``--profile`` costs per verdict: judged verdicts with profiling on and off, alternating.

Judges each (task, candidate) pair ``--repeats`` times with ``profile: cupti`` and as many times
without, alternating on/off so drift hits both sides alike (one warm-up verdict of each first:
CUDA, cuBLAS and the build cache), each verdict with fresh inputs, and prints the wall seconds of
every verdict, the median extra seconds per profiled verdict (median on - median off; the
issue's budget is 0.5 s on an H200), the same for the job's timing phase (where the profiles are
taken), and one JSON line last.  Every profiled verdict must carry both profiles ``ok`` and the
same status as the unprofiled ones on CUDA (the profile is off the verdict's path; on a loaded CPU
timing verdicts vary by themselves).

Default pairs: the bundled examples (``examples/tasks`` with ``examples/candidates``).  On a CPU it
runs too (operator-level profiles), as a smoke of the script, not a figure::

    python benchmarks/profile_cost.py --device cuda --repeats 5
    python benchmarks/profile_cost.py --device cpu --repeats 2      # smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAIRS = [("examples/tasks/diag_matmul.py", "examples/candidates/diag_matmul_broadcast.py"),
         ("examples/tasks/linear_relu.py", "examples/candidates/linear_relu_addmm.py")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--repeats", type=int, default=5, help="verdicts per pair and setting (after one warm-up each)")
    ap.add_argument("--pair", action="append", nargs=2, metavar=("TASK", "CANDIDATE"), default=None,
                    help="a task file and a candidate file (repeatable; default: the bundled examples)")
    args = ap.parse_args(argv)

    from cudal1.config import EvalConfig
    from cudal1.harness.parent.launcher import prestart
    from cudal1.recorded import RecordedJudge
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate, Status

    prestart()
    pairs = [(REPO / t, REPO / c) for t, c in (args.pair or PAIRS)]
    rows: list[dict] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as cache:
        base = EvalConfig(device=args.device, cache_dir=cache)
        for task_path, cand_path in pairs:
            task = load_task_file(task_path)
            cand = Candidate(cand_path.read_text(), task_hash=task.hash, label=cand_path.name)
            for i in range(2 * (args.repeats + 1)):
                mode = "cupti" if i % 2 else "off"
                (r,) = RecordedJudge(base.replace(profile=mode, input_seed=7000 + i), None).judge([(task, cand)])
                timing_s = (r.phase_s or {}).get("timing")
                row = {"task": task.name, "mode": mode, "warmup": i < 2, "status": r.status.value,
                       "wall_s": round(r.wall_s, 3), "timing_s": round(timing_s, 3) if timing_s else None,
                       "message": r.message.splitlines()[0][:160] if r.status is not Status.OK and r.message else ""}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if mode == "cupti" and r.status is Status.OK and not (r.profile and r.profile.reference.ok
                                                                       and r.profile.candidate.ok):
                    problems.append(f"{task.name}: a profiled verdict without both profiles ok")
            statuses = {x["status"] for x in rows if x["task"] == task.name}
            if len(statuses) > 1 and args.device == "cuda":  # a loaded CPU's timing verdicts vary by themselves
                problems.append(f"{task.name}: statuses differ between runs: {sorted(statuses)}")

    def extra(key: str) -> float | None:
        on = [x[key] for x in rows if x["mode"] == "cupti" and not x["warmup"] and x[key] is not None]
        off = [x[key] for x in rows if x["mode"] == "off" and not x["warmup"] and x[key] is not None]
        return round(statistics.median(on) - statistics.median(off), 3) if on and off else None

    summary = {"device": args.device, "repeats": args.repeats, "pairs": len(pairs),
               "median_extra_s_per_profiled_verdict": extra("wall_s"),
               "median_extra_timing_phase_s": extra("timing_s"), "budget_s": 0.5, "problems": problems}
    print(f"median extra seconds per profiled verdict: {summary['median_extra_s_per_profiled_verdict']} "
          f"(timing phase: {summary['median_extra_timing_phase_s']}; budget 0.5 s on an H200)")
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    print(json.dumps(summary))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
