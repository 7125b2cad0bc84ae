"""``cudal1 verify FILE``: audit a published kernel set on this machine's GPU.

Re-judges every record with the full judge (reference = the record's ``ref_code``), compares
measured with claimed speedup and classifies each record.  Writes ``OUT/verify_report.json``,
keeps a resumable run store ``OUT/cudal1.sqlite`` and prints a summary table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cudal1.cli.common import UsageError, add_judge_flags, config_from_args, print_json, progress, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="audit a published kernel set (CUDA-L1 release JSONL or task/code JSONL)", description=__doc__)
    p.add_argument("file", metavar="FILE", help="JSONL records")
    p.add_argument("--suite", default=None, help="tasks for (task, code) records")
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors")
    p.add_argument("--out", default="runs/verify", metavar="DIR", help="output directory")
    p.add_argument("--slack", type=float, default=0.8, help="measured >= SLACK x claimed counts as verified (default 0.8)")
    p.add_argument("--gpus", default=None, metavar="LIST", help="comma-separated GPU indices (default: all)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    add_judge_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cudal1.audit import AuditError, audit_rows, candidates_of, read_records, summarize
    from cudal1.harness import DevicePlan, evaluate_pairs
    from cudal1.store import RunStore
    from cudal1.tasks import load_tasks

    config = config_from_args(args)
    tasks = load_tasks(args.suite, args.source) if args.suite else None
    try:
        records = read_records(args.file, tasks)
    except AuditError as exc:
        raise UsageError(str(exc)) from None
    todo = candidates_of(records)
    plan = DevicePlan.detect(config.device, [int(g) for g in args.gpus.split(",")] if args.gpus else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with RunStore(out / "cudal1.sqlite") as store, progress(len(todo), "verify", not args.json) as bar:
        run_id = store.start_run("verify", config.to_dict() | {"file": str(args.file)})
        results = evaluate_pairs([(t, c) for _, t, c in todo], config, store=store, plan=plan, on_result=lambda r: bar.update(1))
        store.finish_run(run_id, "done")
    rows = audit_rows(records, {i: r for (i, _, _), r in zip(todo, results)}, args.slack)
    summary = summarize(rows)
    env = next((r.environment for r in results), None)
    report = {"summary": summary, "records": rows, "environment": env.__dict__ if env else None,
              "config": config.to_dict(), "file": str(args.file)}
    (out / "verify_report.json").write_text(json.dumps(report, indent=1, default=str))
    if args.json:
        print_json(summary)
        return 0
    print(table(["task", "class", "claimed x", "measured x", "status", "flags"],
                [(r["task"], r["class"], r["claimed"], r["measured"], r["status"], ",".join(r["flags"])) for r in rows]))
    print()
    print(table(["class", "count"], sorted(summary["classes"].items())))
    c, m = summary["claimed"], summary["measured"]
    print(f"\nclaimed  mean {c['mean'] and round(c['mean'], 3)}  median {c['median'] and round(c['median'], 3)}  geomean {c['geomean'] and round(c['geomean'], 3)}")
    print(f"measured mean {m['mean'] and round(m['mean'], 3)}  median {m['median'] and round(m['median'], 3)}  geomean {m['geomean'] and round(m['geomean'], 3)}")
    print(f"report: {out / 'verify_report.json'}")
    return 0
