"""``cudal1 eval-suite``: judge a JSONL of candidates (``task``, ``code``) against a task suite,
in parallel over all local GPUs (one timing lane per GPU), with a progress bar and a table.

Results go to ``OUT/cudal1.sqlite`` (resumable: re-running skips what is recorded) and
``OUT/results.jsonl`` (one line per candidate, input order); ``OUT/summary.json`` holds the summary
(``--json`` prints it), with ``batch``: where the time went (build queue, builds, judging, idle lanes)."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from cudal1.figures import geomean
from cudal1.jsonl import JsonlError, iter_jsonl
from cudal1.cli.common import (UsageError, add_backend_flags, add_judge_flags, batch_line, batch_summary, config_from_args,
                               plan_from_args, print_json, progress, table)
from cudal1.types import Candidate, EvalResult, Task


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval-suite", help="judge a JSONL of candidates against a suite", description=__doc__)
    p.add_argument("--candidates", required=True, metavar="FILE.jsonl", help="lines with 'task' and 'code' (optional 'label')")
    p.add_argument("--suite", required=True, help="kernelbench:level1, kernelbench:level2/1-20, a task dir, JSONL or .py")
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors (else $CUDAL1_KERNELBENCH, else the HF dataset)")
    p.add_argument("--out", default="runs/eval-suite", metavar="DIR", help="output directory (run store + results.jsonl)")
    p.add_argument("--gpus", default=None, metavar="LIST", help="comma-separated GPU indices (default: all)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line of stdout")
    add_judge_flags(p)
    add_backend_flags(p)
    p.set_defaults(func=run)


def read_candidates(path: str, tasks: list[Task]) -> list[tuple[Task, Candidate]]:
    from cudal1.tasks import find_task

    pairs = []
    try:
        lines = list(iter_jsonl(path))
    except JsonlError as exc:
        raise UsageError(str(exc)) from None
    for n, rec in lines:
        if "task" not in rec or "code" not in rec:
            raise UsageError(f"{path}:{n}: expected a JSON object with 'task' and 'code'")
        key, code = str(rec["task"]), rec["code"]
        if not isinstance(code, str) or not code.strip():
            raise UsageError(f"{path}:{n}: 'code' must be non-empty source text")
        task = find_task(tasks, key)
        pairs.append((task, Candidate(code, task_hash=task.hash, label=str(rec.get("label") or f"{path}:{n}"))))
    if not pairs:
        raise UsageError(f"{path}: no candidates")
    return pairs


def summarize(results: list[EvalResult]) -> dict:
    speedups = [r.speedup for r in results if r.speedup is not None]
    return {
        "evaluated": len(results),
        "statuses": dict(Counter(r.status.value for r in results)),
        "speedup_mean": statistics.fmean(speedups) if speedups else None,
        "speedup_median": statistics.median(speedups) if speedups else None,
        "speedup_geomean": geomean(speedups),
        "fast_1": sum(s > 1.0 for s in speedups) / len(results) if results else None,
    }


def run(args: argparse.Namespace) -> int:
    from cudal1.runs import judge_recorded
    from cudal1.store import RunStore
    from cudal1.tasks import load_tasks

    from cudal1.config import write_config_file

    config = config_from_args(args)
    tasks = load_tasks(args.suite, args.source)
    pairs = read_candidates(args.candidates, tasks)
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    plan = plan_from_args(args, config.device, gpus)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_config_file(out, judge=config, run={"command": "eval-suite", "suite": args.suite, "source": args.source, "candidates": str(args.candidates),
                                                    "device": plan.device, "lanes": list(plan.lanes), "backend": plan.backend})
    with RunStore(out / "cudal1.sqlite") as store, progress(len(pairs), "eval-suite", not args.json) as bar:
        run_id = store.start_run("eval-suite", config.to_dict())
        stats: list = []
        results = judge_recorded(pairs, config, store=store, plan=plan, on_result=lambda r: bar.update(1), on_stats=stats.append)
        store.finish_run(run_id, "done")
    with open(out / "results.jsonl", "w") as f:
        for (task, cand), r in zip(pairs, results):
            f.write(json.dumps(r.summary() | {"label": cand.label}, default=str) + "\n")
    summary = summarize(results) | {"out": str(out), "device": plan.device, "lanes": len(plan.lanes),
                                    "backend": plan.backend, "batch": batch_summary(stats)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if args.json:
        print_json(summary)
        return 0
    rows = [(t.task_id, c.label[-28:], r.status.value, r.speedup, r.reference_ms, r.candidate_ms, ",".join(r.flags))
            for (t, c), r in zip(pairs, results)]
    print(table(["task", "candidate", "status", "speedup", "ref ms", "cand ms", "flags"], rows))
    print(f"\n{summary['evaluated']} evaluated: " + ", ".join(f"{k} {v}" for k, v in summary["statuses"].items())
          + f"; geomean speedup of ok {summary['speedup_geomean'] and round(summary['speedup_geomean'], 3)}; results in {out}")
    print(batch_line(summary["batch"]))
    return 0
