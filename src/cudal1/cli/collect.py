"""``cudal1 collect``: verified training data (CUDA-L1 stage 0).

From teachers: ``--suite S --teacher URL=MODEL [--teacher ...] --attempts N --per-task K --out
DATA.jsonl`` samples each OpenAI-compatible endpoint N times per task, judges every program and
keeps at most K verified ones per task (``ok``, not on a degenerate task), fastest first.
From a published set: ``--from FILE`` (CUDA-L1 release JSONL, or ``task``/``code`` lines with
``--suite``) re-judges every record here and keeps only what verifies.  ``--smoke`` starts a
scripted local teacher (answers with good, broken and cheating code) on the bundled task.

Output: one JSON object per line — ``messages`` (system, user, assistant) plus provenance
(``source``, ``task``, ``status``, ``speedup``, ``config_hash``, ``environment`` ...) — loadable with
``datasets.load_dataset("json", data_files=...)``.  Resumable: the run store ``DATA.sqlite`` next to
the output remembers every answer and verdict."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from cudal1.cli.options import UsageError, add_backend_flags, add_judge_flags, config_from_args, plan_from_args
from cudal1.cli.output import print_json, table
from cudal1.cli.progress import progress
from cudal1.config import SAMPLING_TEMPERATURE

if TYPE_CHECKING:
    from cudal1.recorded import RecordedJudge


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collect", help="verified training data from teachers or a published set", description=__doc__)
    p.add_argument("--suite", default=None, help="tasks: a .py, a directory, a JSONL or kernelbench:level1/1-20")
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors")
    p.add_argument("--teacher", action="append", default=[], metavar="URL=MODEL",
                   help="an OpenAI-compatible endpoint and its model (repeatable)")
    p.add_argument(
        "--from", dest="from_file", default=None, metavar="FILE", help="re-judge a published kernel set instead"
    )
    p.add_argument(
        "--attempts",
        type=int,
        default=None,
        help="answers asked per task per teacher (default 20; --smoke: one pass over its script)",
    )
    p.add_argument(
        "--per-task", type=int, default=2, help="verified programs kept per task, fastest first (default 2; 0 = all)"
    )
    p.add_argument(
        "--out", default="runs/collect/data.jsonl", metavar="DATA.jsonl", help="output JSONL (store: DATA.sqlite)"
    )
    p.add_argument("--smoke", action="store_true", help="scripted local teacher on the bundled task (CPU)")
    p.add_argument("--allow-held-out", action="store_true",
                   help="admit KernelBench held-out tasks (by default a suite holding one is refused and --from leaves "
                        "their records out)")
    p.add_argument(
        "--gpus", default=None, metavar="LIST", help="comma-separated GPU indices for judging (default: all)"
    )
    t = p.add_argument_group("teacher sampling")
    t.add_argument(
        "--temperature", type=float, default=None, help=f"sampling temperature (default: {SAMPLING_TEMPERATURE})"
    )
    t.add_argument("--max-tokens", type=int, default=None, help="completion token limit")
    t.add_argument("--concurrency", type=int, default=None, help="requests in flight per teacher")
    t.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", metavar="VAR", help="environment variable holding the API key"
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    add_judge_flags(p)
    add_backend_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cudal1.recorded import RecordedJudge
    from cudal1.train.stages.collect import CollectError, collect_file, collect_teachers, parse_teacher

    if args.smoke:
        from cudal1.train.smoke import smoke_judge_config

        config = config_from_args(args, base=smoke_judge_config(args.device or "cpu"))
    else:
        config = config_from_args(args)
    # bad input is refused before the judge starts
    if args.from_file and not args.smoke and not Path(args.from_file).is_file():
        raise UsageError(f"cannot read {args.from_file}: no such file")
    if not (args.smoke or args.from_file):
        if not args.suite or not args.teacher:
            raise UsageError("collect needs --suite and at least one --teacher URL=MODEL (or --from FILE, or --smoke)")
        _require_openai()
        try:
            teachers = [parse_teacher(t) for t in args.teacher]
        except CollectError as exc:
            raise UsageError(str(exc)) from None
    tasks = _tasks(args) if args.suite and not args.smoke else None
    plan = plan_from_args(args, config.device, [int(g) for g in args.gpus.split(",")] if args.gpus else None)
    try:
        with progress(0, "collect", not args.json) as bar:
            judge = RecordedJudge(config, plan=plan, on_event=lambda e: bar.update(1) if e.kind == "verdict" else None)
            if args.smoke:
                summary = _smoke(args, judge)
            elif args.from_file:
                summary = collect_file(args.from_file, tasks, args.per_task, args.out, judge,
                                       allow_held_out=args.allow_held_out, kernelbench=args.source)
            else:
                summary = collect_teachers(tasks, teachers, args.attempts or 20, args.per_task, args.out, judge,
                                           policy_options=_policy_options(args), allow_held_out=args.allow_held_out,
                                           kernelbench=args.source)
    except CollectError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print_json(summary)
    else:
        print(table(["outcome", "count"], sorted(summary["judged"].items())))
        print(
            f"\nkept {summary['kept']} verified program(s) for {summary['tasks_with_data']} task(s): {summary['out']} "
            f"(run store {summary['store']})"
        )
        if summary.get("held_out_left_out"):
            print(f"left out {summary['held_out_left_out']} record(s) of held-out tasks (--allow-held-out admits them)")
    return 0


def _tasks(args: argparse.Namespace):
    from cudal1.tasks import load_tasks

    return load_tasks(args.suite, args.source)


def _require_openai() -> None:
    from cudal1.extras import require

    require("collect from teachers", "openai", extra="llm")


def _policy_options(args: argparse.Namespace) -> dict:
    opts = {"temperature": args.temperature, "max_tokens": args.max_tokens, "concurrency": args.concurrency,
            "api_key_env": args.api_key_env, "max_retries": 2}
    return {k: v for k, v in opts.items() if v is not None}


def _smoke(args: argparse.Namespace, judge: RecordedJudge) -> dict:
    from cudal1.train.smoke import scripted_teacher, smoke_task, teacher_script
    from cudal1.train.stages.collect import Teacher, collect_teachers

    _require_openai()
    attempts = args.attempts or len(teacher_script())  # by default one pass over the script: every kind of answer
    with scripted_teacher() as teacher:
        summary = collect_teachers([smoke_task()], [Teacher(teacher.url, teacher.model)], attempts, args.per_task,
                                   args.out, judge, policy_options=_policy_options(args) | {"temperature": 0.0})
    return summary
