"""``cudal1 judge-suite`` (also ``cudal1 eval-suite``): judge a JSONL of candidates (``task``,
``code``) against a task suite, in parallel over all local GPUs (one timing lane per GPU), with a
progress bar and a table.

Results go to ``OUT/cudal1.sqlite`` (resumable: re-running skips what is recorded) and
``OUT/results.jsonl`` (one line per candidate, input order); ``OUT/summary.json`` holds the summary
(``--json`` prints it), with ``batch``: where the time went (build queue, builds, judging, idle lanes)."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter

from cudal1.cli.options import (
    UsageError,
    add_backend_flags,
    add_judge_flags,
    add_out_flags,
    config_from_args,
    early_guard,
    load_suite,
    plan_from_args,
    resolve_device,
    run_out,
)
from cudal1.cli.output import as_user_file, batch_line, batch_summary, print_json, table
from cudal1.cli.progress import progress_for
from cudal1.jsonl import JsonlError, iter_jsonl
from cudal1.speedup import LEGEND, faster, noisy, result_cell, uncertain
from cudal1.tables import geomean
from cudal1.types import Candidate, EvalResult, Task


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "judge-suite",
        aliases=["eval-suite"],
        help="judge a JSONL of candidates against a suite (alias: eval-suite)",
        description=__doc__,
    )
    p.add_argument(
        "--candidates", required=True, metavar="FILE.jsonl", help="lines with 'task' and 'code' (optional 'label')"
    )
    p.add_argument(
        "--suite", required=True, help="kernelbench:level1, kernelbench:level2/1-20, a task dir, JSONL or .py"
    )
    p.add_argument(
        "--source",
        default=None,
        metavar="PATH",
        help="KernelBench JSONL or directory for suite selectors (else $CUDAL1_KERNELBENCH, else the HF dataset)",
    )
    add_out_flags(p, "judge-suite", "results.jsonl, summary.json, config.yaml, the run store cudal1.sqlite")
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
    """Counts and speedup figures of a batch; ``faster`` counts the verdicts whose 95% CI is above
    1.0, ``faster_point`` those whose point value is (``fast_1``: their share, KernelBench's)."""
    speedups = [r.speedup for r in results if r.speedup is not None]
    return {
        "evaluated": len(results),
        "statuses": dict(Counter(r.status.value for r in results)),
        "speedup_mean": statistics.fmean(speedups) if speedups else None,
        "speedup_median": statistics.median(speedups) if speedups else None,
        "speedup_geomean": geomean(speedups),
        "faster": sum(1 for r in results if faster(r)),
        "faster_point": sum(1 for s in speedups if s > 1.0),
        "fast_1": sum(s > 1.0 for s in speedups) / len(results) if results else None,
    }


def run(args: argparse.Namespace) -> int:
    from cudal1.config import write_config_file
    from cudal1.recorded import RecordedJudge
    from cudal1.store import RunStore

    config = config_from_args(args)
    early_guard(args, config)  # bad input is refused before the judge is imported
    tasks, skipped = load_suite(args, args.suite, args.source)
    pairs = read_candidates(args.candidates, tasks)
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    plan = plan_from_args(args, config.device, gpus)
    config = resolve_device(config, plan)
    out = run_out(args, "judge-suite", args.candidates, config)
    out.mkdir(parents=True, exist_ok=True)
    write_config_file(out, judge=config, run={"command": "judge-suite", "suite": args.suite, "source": args.source,
                                              "candidates": str(args.candidates), "device": plan.device,
                                              "lanes": list(plan.lanes), "backend": plan.backend})
    stats: list = []
    with RunStore(out / "cudal1.sqlite") as store, progress_for(args, "judge-suite", len(pairs)) as progress:
        judge = RecordedJudge(config, store, plan=plan, on_event=progress)
        done = sum(judge.verdict(t, c) is not None for t, c in pairs)
        progress.line(f"{len(pairs)} candidate(s) on {plan.hardware_name()}; out {out}"
                      + (f"; resuming: {done} already judged" if done else ""))
        run_id = store.start_run("judge-suite", {"judge_hash": judge.config_hash, "judge": config.to_dict()})
        results = judge.judge(pairs, on_stats=stats.append)
        store.finish_run(run_id, "done")
    for (_, cand), r in zip(pairs, results):
        as_user_file(r, cand.label)
    with open(out / "results.jsonl", "w") as f:
        for (_, cand), r in zip(pairs, results):
            f.write(json.dumps(r.summary() | {"label": cand.label}, default=str) + "\n")
    summary = summarize(results) | {"out": str(out), "device": plan.device, "lanes": len(plan.lanes),
                                    "backend": plan.backend, "batch": batch_summary(stats),
                                    "skipped_tasks": [{"path": p, "error": e} for p, e in skipped]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if args.json:
        print_json(summary)
        return 0
    rows = [
        (t.task_id, c.label[-28:], r.status.value, result_cell(r), r.reference_ms, r.candidate_ms, ",".join(r.flags))
        for (t, c), r in zip(pairs, results)
    ]
    print(table(["task", "candidate", "status", "speedup", "ref ms", "cand ms", "flags"], rows))
    print(
        f"\n{summary['evaluated']} evaluated: "
        + ", ".join(f"{k} {v}" for k, v in summary["statuses"].items())
        + f"; faster than the reference (95% CI above 1.0): {summary['faster']}, by point value only: "
        f"{summary['faster_point']}; geomean speedup of ok "
        f"{summary['speedup_geomean'] and round(summary['speedup_geomean'], 3)}; "
        f"results in {out}"
    )
    if any(uncertain(r.speedup, r.speedup_ci) or noisy(r) for r in results):
        print(LEGEND)
    print(batch_line(summary["batch"]))
    return 0
