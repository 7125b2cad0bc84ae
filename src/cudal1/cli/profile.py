"""``cudal1 profile``: profile a program on one call without judging it: a task's reference, or a
candidate beside it (``--candidate``).

The two programs run in the judge's two processes as in ``cudal1 judge`` (the candidate confined,
checked for correctness first: a candidate that fails has no profile), timed briefly, then
profiled once each after timing; the verdict is not shown or recorded.  A candidate's profile
comes from its own process and is information only.  ``--tool ncu`` adds Nsight Compute's
metrics where ``ncu`` runs (it runs the files outside the sandbox); where it cannot, one line
says why.  Also: ``--profile [cupti|ncu]`` for ``judge`` and ``optimize`` (flags defined here).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cudal1.cli.options import UsageError, add_judge_flags, config_from_args, load_suite, read_text
from cudal1.cli.output import print_json
from cudal1.profile.model import TOOLS

PROFILE_TIMING = {"correctness_trials": 1, "timing_trials": 10, "min_timing_trials": 3, "timing_budget_s": 0.5}


def add_profile_flag(p: argparse.ArgumentParser, tools: tuple[str, ...] = TOOLS, what: str = "") -> None:
    """``--profile [TOOL]`` (bare: cupti)."""
    p.add_argument("--profile", nargs="?", const="cupti", choices=tools, default=None, metavar="|".join(tools),
                   help="profile both programs once after timing, off the verdict's path (cupti: torch.profiler, "
                        "operator times on the CPU" + (", ncu: also Nsight Compute's metrics, running the files "
                        "outside the sandbox" if "ncu" in tools else "") + f"){what}; a candidate's profile is "
                        "information only (bare --profile: cupti)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="profile a task's reference (and a candidate) without judging",
                       description=__doc__)
    p.add_argument("target", metavar="TASK_OR_FILE",
                   help="a task .py, or a selector naming one task (with --source), e.g. kernelbench:level1/19")
    p.add_argument("--candidate", default=None, metavar="FILE", help="a file defining ModelNew, profiled beside it")
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for a selector")
    p.add_argument("--tool", choices=TOOLS, default="cupti", help="cupti (torch.profiler) or ncu (also Nsight Compute)")
    p.add_argument("--top", type=int, default=5, metavar="N", help="kernels shown per program")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    add_judge_flags(p)
    p.set_defaults(func=run)


def _task(args: argparse.Namespace) -> tuple[Any, str | None]:
    """(the task, its file when it is one)."""
    from cudal1.tasks import load_task_file

    if Path(args.target).is_file():
        return load_task_file(args.target), args.target
    tasks, _ = load_suite(args, args.target, args.source)
    if len(tasks) != 1:
        raise UsageError(f"{args.target} names {len(tasks)} tasks; profile takes one task")
    return tasks[0], None


def add_ncu(result: Any, task_file: str | None, candidate_file: str | None, quiet: bool = False) -> None:
    """Nsight Compute's metrics into ``result.profile`` (reference, and the candidate when given),
    or the one-line reason it cannot run, printed and kept in each profile's note."""
    from cudal1.profile.ncu import run_ncu

    if result.profile is None:
        return
    programs = [(result.profile.reference, None)]
    if candidate_file:
        programs.append((result.profile.candidate, candidate_file))
    for program, cand in programs:
        got = run_ncu(task_file, cand) if task_file else "ncu: no task file to run"
        if isinstance(got, str):
            program.note = f"{program.note}; {got}".strip("; ")
            if not quiet:
                print(f"cudal1: {got}", file=sys.stderr)
            return
        program.ncu = got
        result.profile.tool = "ncu"


def run(args: argparse.Namespace) -> int:
    from cudal1.harness.parent.launcher import prestart
    from cudal1.types import Candidate, Status, reference_candidate

    if args.top < 1:
        raise UsageError("--top must be at least 1")
    task, task_file = _task(args)
    config = config_from_args(args).replace(profile="cupti", **PROFILE_TIMING)
    candidate = (Candidate(read_text(args.candidate, "candidate"), task_hash=task.hash, label=args.candidate)
                 if args.candidate else reference_candidate(task))
    prestart()
    from cudal1.recorded import RecordedJudge

    (result,) = RecordedJudge(config, None).judge([(task, candidate)])
    if args.tool == "ncu":
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            if task_file is None:  # a selector's task: ncu's process loads it from a file
                task_file = str(Path(tmp) / f"{task.name}.py")
                Path(task_file).write_text(task.source)
            add_ncu(result, task_file, args.candidate, quiet=getattr(args, "quiet", False))
    pair = result.profile
    failed = ""
    if result.status is not Status.OK:
        failed = result.status.value + (f": {result.message.splitlines()[0][:300]}" if result.message else "")
    if args.json:
        print_json({"task": task.name, "task_hash": task.hash, "candidate": args.candidate, "status":
                    result.status.value, "message": failed, "profile": pair.to_dict() if pair else None})
        return 0
    from cudal1.profile.text import describe_profiles, describe_program

    if pair is None:
        print(f"no profile: the {'candidate' if args.candidate else 'reference'} did not get through the judge "
              f"({failed or 'no verdict'})")
        return 0
    if args.candidate:
        print("\n".join(describe_profiles(pair, args.top)))
    else:
        print(f"profile ({pair.tool}) of {task.name}")
        print("\n".join(describe_program("reference", pair.reference, args.top)))
    return 0
