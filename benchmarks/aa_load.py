"""A/A under host load: the same program judged against itself, on a quiet host and beside busy
processes, and what the verdicts claim.

    python benchmarks/aa_load.py [--task examples/tasks/linear_relu.py] [--runs 20] [--load 2]
        [--device auto] [--json PATH]

Judges ``--runs`` copies of the task's reference renamed ``ModelNew`` (a comment apart, so none
is deduplicated) in one batch, first quietly, then with ``--load`` processes spinning beside the
judge.  Prints, per condition: how many verdicts have a CI that includes 1.0, carry
``contended``, say faster or slower (cudal1.speedup.faster / slower), and the median speedup and
CI width; the table is last.  Acceptance on a 2-core host with 2 busy processes: at least 19 of
20 include 1.0 or are contended, none says faster or slower, and the quiet CI stays narrow.
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

REPO = Path(__file__).resolve().parent.parent


def judge(task_path: Path, runs: int, device: str) -> list:
    from cudal1.config import EvalConfig
    from cudal1.harness import evaluate_pairs
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate

    task = load_task_file(task_path)
    source = task.source.replace("class Model(", "class ModelNew(")
    pairs = [(task, Candidate(f"# A/A copy {i}\n{source}", task_hash=task.hash, label=f"aa{i}")) for i in range(runs)]
    return evaluate_pairs(pairs, EvalConfig(device=device))


def tally(results: list) -> dict:
    from cudal1.speedup import faster, slower

    ok = [r for r in results if r.status.value == "ok" and r.speedup is not None]
    widths = [r.speedup_ci[1] - r.speedup_ci[0] for r in ok if r.speedup_ci]
    return {
        "verdicts": len(results), "ok": len(ok),
        "ci_includes_1": sum(1 for r in ok if r.speedup_ci and r.speedup_ci[0] <= 1.0 <= r.speedup_ci[1]),
        "contended": sum(1 for r in ok if "contended" in r.flags),
        "includes_1_or_contended": sum(1 for r in ok if "contended" in r.flags or
                                       (r.speedup_ci and r.speedup_ci[0] <= 1.0 <= r.speedup_ci[1])),
        "says_faster": sum(1 for r in ok if faster(r)), "says_slower": sum(1 for r in ok if slower(r)),
        "median_speedup": statistics.median(r.speedup for r in ok) if ok else None,
        "median_ci_width": statistics.median(widths) if widths else None,
        "speedups": [round(r.speedup, 4) for r in ok],
        "cis": [[round(x, 4) for x in r.speedup_ci] if r.speedup_ci else None for r in ok],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", type=Path, default=REPO / "examples" / "tasks" / "linear_relu.py")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--load", type=int, default=2, help="busy processes beside the judge in the loaded condition")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    rows = {}
    t0 = time.time()
    rows["quiet"] = tally(judge(args.task, args.runs, args.device))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        rows[f"{args.load} busy"] = tally(judge(args.task, args.runs, args.device))
    finally:
        for p in spinners:
            p.kill()
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "args": vars(args) | {"task": str(args.task)},
                                               "cpus": os.cpu_count(), "wall_s": time.time() - t0}, indent=1))
    print(
        f"A/A of {args.task.name} ({args.runs} verdicts per condition, {os.cpu_count()} CPUs, {time.time() - t0:.0f} s)"
    )
    print(f"{'condition':<10} {'ok':>4} {'CI has 1':>8} {'contended':>9} {'either':>6} {'faster':>6} {'slower':>6} "
          f"{'median x':>8} {'CI width':>8}")
    for name, r in rows.items():
        print(
            f"{name:<10} {r['ok']:>4} {r['ci_includes_1']:>8} {r['contended']:>9} {r['includes_1_or_contended']:>6} "
            f"{r['says_faster']:>6} {r['says_slower']:>6} {r['median_speedup'] or 0:>8.3f} "
            f"{r['median_ci_width'] or 0:>8.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
