"""``cudal1 verify FILE``: audit a published kernel set on this machine's GPU.

Re-judges every record with the full judge (reference = the record's ``ref_code``), compares
measured with claimed speedup and classifies each record.  Writes ``OUT/verify_report.json``,
keeps a resumable run store ``OUT/cudal1.sqlite`` and prints a summary table.  ``cudal1 report OUT``
renders the run (with the audit classes) as HTML, Markdown or JSON."""

from __future__ import annotations

import argparse
import json

from cudal1.cli.options import (
    UsageError,
    add_backend_flags,
    add_judge_flags,
    add_out_flags,
    config_from_args,
    early_guard,
    plan_from_args,
    resolve_device,
    run_out,
)
from cudal1.cli.output import batch_line, batch_summary, print_json, table
from cudal1.cli.progress import progress_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify", help="audit a published kernel set (CUDA-L1 release JSONL or task/code JSONL)", description=__doc__
    )
    p.add_argument("file", metavar="FILE", help="JSONL records")
    p.add_argument("--suite", default=None, help="tasks for (task, code) records")
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors")
    add_out_flags(p, "verify", "verify_report.json, config.yaml, the run store cudal1.sqlite")
    p.add_argument(
        "--slack",
        type=float,
        default=None,
        help="measured >= SLACK x claimed counts as verified (default: cudal1.report.verify.DEFAULT_SLACK, 0.8)",
    )
    p.add_argument("--gpus", default=None, metavar="LIST", help="comma-separated GPU indices (default: all)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    add_judge_flags(p)
    add_backend_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cudal1.config import write_config_file
    from cudal1.recorded import RecordedJudge
    from cudal1.report.verify import DEFAULT_SLACK, VerifyError, candidates_of, read_records, verify_report
    from cudal1.store import RunStore
    from cudal1.tasks import load_tasks

    config = config_from_args(args)
    if args.slack is None:
        args.slack = DEFAULT_SLACK
    early_guard(args, config)  # bad input is refused before the judge is imported
    tasks = load_tasks(args.suite, args.source) if args.suite else None
    try:
        records = read_records(args.file, tasks)
    except VerifyError as exc:
        raise UsageError(str(exc)) from None
    todo = candidates_of(records)
    plan = plan_from_args(args, config.device, [int(g) for g in args.gpus.split(",")] if args.gpus else None)
    config = resolve_device(config, plan)
    out = run_out(args, "verify", args.file, config)
    out.mkdir(parents=True, exist_ok=True)
    write_config_file(out, judge=config, run={"command": "verify", "file": str(args.file), "suite": args.suite,
                                              "slack": args.slack, "device": plan.device, "lanes": list(plan.lanes),
                                              "backend": plan.backend})
    stats: list = []
    with RunStore(out / "cudal1.sqlite") as store, progress_for(args, "verify", len(todo)) as progress:
        judge = RecordedJudge(config, store, plan=plan, on_event=progress)
        done = sum(judge.verdict(t, c) is not None for _, t, c in todo)
        progress.line(f"{len(todo)} record(s) with code on {plan.hardware_name()}; out {out}"
                      + (f"; resuming: {done} already judged" if done else ""))
        run_id = store.start_run(
            "verify", {"judge_hash": judge.config_hash, "judge": config.to_dict(), "file": str(args.file)}
        )
        results = judge.judge([(t, c) for _, t, c in todo], on_stats=stats.append)
        store.finish_run(run_id, "done")
    report = verify_report(
        records, {i: r for (i, _, _), r in zip(todo, results)}, args.slack, config.to_dict(), str(args.file)
    )
    report["summary"]["batch"] = batch_summary(stats)  # where the time went (see docs/harness.md)
    summary, rows = report["summary"], report["records"]
    (out / "verify_report.json").write_text(json.dumps(report, indent=1, default=str))
    if args.json:
        print_json(summary)
        return 0
    print(
        table(
            ["task", "class", "claimed x", "measured x", "status", "flags"],
            [(r["task"], r["class"], r["claimed"], r["measured"], r["status"], ",".join(r["flags"])) for r in rows],
        )
    )
    print()
    print(table(["class", "count"], sorted(summary["classes"].items())))
    print()
    print(
        table(
            ["speedups", "mean", "median", "geomean"],
            [(k, summary[k]["mean"], summary[k]["median"], summary[k]["geomean"]) for k in ("claimed", "measured")],
        )
    )
    print(batch_line(summary["batch"]))
    print(f"report: {out / 'verify_report.json'}")
    return 0
