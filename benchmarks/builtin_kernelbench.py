"""Run the builtin (no-LLM) policy over KernelBench tasks on this machine's GPUs and report.

Usage (from the repository root, on a CUDA machine)::

    python benchmarks/builtin_kernelbench.py kernelbench:level1/1-100 kernelbench:level2/1-100 \
        --rounds 2 --samples 2 --out runs/builtin_kb [--budget-minutes 8] [--subset stride:10]

``--subset stride:N`` keeps every N-th task of each selector (by problem id), ``algebraic`` keeps
the tasks where a graph pass applies (traced in child processes on the CPU, no GPU needed), and
both may be given (union).  The selection is written to ``OUT/tasks.txt`` (task id and the
rules that kept it) and reused when the run is resumed (``--reselect`` applies the rules again).
The search is ``cudal1.search.optimize`` with ``BuiltinPolicy`` (``--passes`` picks and orders
its passes) and the judge preset ``--preset`` (``default``: strict fp32 tolerance;
``kernelbench-v0``: KernelBench's atol = rtol = 1e-2, comparable with published numbers);
resumable with the same ``--out``.  The report (printed, and written to ``OUT/report.json`` and
``OUT/report.md``) is :func:`cudal1.report.builtin.builtin_report` (its docstring defines every
figure); ``--confirm`` re-times each task's winner and its torch.compile candidate with fresh
inputs (:func:`cudal1.report.builtin.confirm`).  ``OUT/report.html`` is the general report of the
same run store (``cudal1 report OUT``), written when the ``report`` extra is installed.
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import time
from pathlib import Path

from cudal1.config import EvalConfig
from cudal1.harness import DevicePlan
from cudal1.policy.builtin import BuiltinPolicy, prepare_rewrites
from cudal1.report import ReportError, render_report
from cudal1.report.builtin import builtin_markdown, builtin_report, confirm
from cudal1.search import SearchConfig, optimize
from cudal1.tasks import load_tasks


def select(selectors: list[str], subset: list[str]) -> tuple[list, dict[str, list[str]]]:
    """The tasks of ``selectors`` kept by the ``subset`` rules, and for each task id the rules that
    kept it (so a report can separate an unbiased stride sample from tasks chosen for a pass)."""
    tasks, rules_of = [], {}
    for sel in selectors:
        got = sorted(load_tasks(sel), key=lambda t: (t.level or 0, int(t.problem_id or 0)))
        keep: dict[str, list[str]] = {}
        for rule in subset or ["all"]:
            if rule == "all":
                hit = {t.hash for t in got}
            elif rule.startswith("stride:"):
                n = int(rule.split(":")[1])
                hit = {t.hash for i, t in enumerate(got) if i % n == 0}
            elif rule == "algebraic":  # the policy's own cache: traced once for selection and search
                outcomes = prepare_rewrites([t.source for t in got])
                hit = {t.hash for t, o in zip(got, outcomes) if o.ok}
            else:
                raise SystemExit(f"unknown --subset rule {rule!r} (all | stride:N | algebraic)")
            for h in hit:
                keep.setdefault(h, []).append(rule)
        for t in got:
            if t.hash in keep:
                tasks.append(t)
                rules_of[t.task_id] = keep[t.hash]
    return tasks, rules_of


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("selectors", nargs="+")
    ap.add_argument("--subset", action="append", default=[], help="all | stride:N | algebraic (repeatable: union)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--budget-minutes", type=float, default=None)
    ap.add_argument("--passes", default=None,
                    help="comma-separated builtin passes in proposal order (default: all registered, in order)")
    ap.add_argument("--out", default="runs/builtin_kb")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="default", help="judge preset: default (strict fp32) | kernelbench-v0 | ...")
    ap.add_argument("--workers-per-gpu", type=int, default=1,
                    help="judge workers sharing each GPU (timing stays exclusive: EvalConfig.workers_per_gpu)")
    ap.add_argument("--report-only", action="store_true", help="recompute the report from OUT without judging")
    ap.add_argument("--confirm", action="store_true",
                    help="after the search, re-judge each task's winner and torch.compile candidate with fresh inputs")
    ap.add_argument("--reselect", action="store_true",
                    help="apply the selectors and --subset again even when OUT/tasks.txt lists the run's tasks")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(240, repeat=True)  # a stalled run shows where it stands
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    listed = out / "tasks.txt"
    if listed.exists() and not args.reselect:  # the tasks of the run being resumed or reported
        rules_of = {line.split()[0]: (line.split()[1].split(",") if len(line.split()) > 1 else [])
                    for line in listed.read_text().splitlines() if line.strip()}
        tasks = [t for sel in args.selectors for t in load_tasks(sel) if t.task_id in rules_of]
    else:
        tasks, rules_of = select(args.selectors, args.subset)
        listed.write_text("".join(f"{t.task_id}\t{','.join(rules_of[t.task_id])}\n" for t in tasks))
    judge = EvalConfig.preset(args.preset).replace(device=args.device, workers_per_gpu=args.workers_per_gpu)
    if not args.report_only:
        plan = DevicePlan.detect(args.device)
        passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None
        policy = BuiltinPolicy(device=plan.device, passes=passes)
        t0 = time.monotonic()
        done = [0]

        def tick(r):
            done[0] += 1
            print(f"[{time.monotonic() - t0:6.0f}s] {done[0]:4d} {r.task_name[:48]:48s} {r.status.value:14s} "
                  f"{r.speedup if r.speedup is None else round(r.speedup, 3)} {','.join(r.flags)}", flush=True)

        print(f"{len(tasks)} tasks on {plan.device} lanes {plan.lanes}", flush=True)
        optimize(tasks, policy, SearchConfig(rounds=args.rounds, samples=args.samples,
                                             budget_minutes=args.budget_minutes), judge, out, plan=plan,
                 hardware="GPU", on_result=tick)
        if args.confirm:
            confirm(out, tasks, judge, plan, builtin_report(out, tasks, judge, rules_of)["rows"], tick)
    text = builtin_markdown(builtin_report(out, tasks, judge, rules_of))
    (out / "report.md").write_text(text + "\n")
    print(text)
    try:  # the general report of the same store, when the report extra is installed
        (out / "report.html").write_text(render_report([str(out)], "html"))
        print(f"\nHTML report: {out / 'report.html'}")
    except (ImportError, ReportError) as exc:
        print(f"\nno HTML report: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
