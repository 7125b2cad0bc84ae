"""``cudal1 judge`` (also ``cudal1 eval``): judge one candidate file against one reference file."""

from __future__ import annotations

import argparse

from cudal1.cli.options import add_judge_flags, config_from_args, out_dir, read_text
from cudal1.cli.output import as_user_file, fmt, print_json
from cudal1.cli.profile import add_ncu, add_profile_flag
from cudal1.speedup import faster, result_cell, slower
from cudal1.types import Candidate, EvalResult


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("judge", aliases=["eval"], help="judge one candidate against a reference (alias: eval)",
                       description=__doc__)
    p.add_argument("--reference", required=True, metavar="REF.py", help="KernelBench-format task file")
    p.add_argument("--candidate", required=True, metavar="CAND.py", help="source defining ModelNew")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="record the verdict in DIR/cudal1.sqlite (a run directory: cudal1 report reads it; a candidate "
                        "judged there before is not judged again); default: record nothing")
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)  # older spelling: a store file
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    add_profile_flag(p, what=": printed side by side, under 'profile' with --json")
    add_judge_flags(p)
    p.set_defaults(func=run)


def describe(r: EvalResult) -> str:
    lines = [f"status      {r.status.value}"]
    if r.speedup is not None:
        ci = f"  (95% CI {r.speedup_ci[0]:.3g}-{r.speedup_ci[1]:.3g})" if r.speedup_ci else ""
        verdict = ("not trusted: the host or GPU was shared while it was timed (contended)" if "contended" in r.flags
                   else "faster than the reference" if faster(r) else "slower than the reference" if slower(r)
                   else "not measurably faster or slower (the CI includes 1.0)")
        lines.append(f"speedup     {result_cell(r)}{ci}: {verdict}")
    if r.reference and r.candidate:
        lines.append(
            f"reference   {fmt(r.reference.median_ms)} ms (IQR {fmt(r.reference.iqr_ms)}, n={r.reference.trials})"
        )
        lines.append(
            f"candidate   {fmt(r.candidate.median_ms)} ms (IQR {fmt(r.candidate.iqr_ms)}, n={r.candidate.trials}, "
            f"clock {r.candidate.clock})"
        )
    other = {
        k: v for k, v in (r.figures or {}).items()
        if k != (r.timing_figure or "gpu") and isinstance(v, dict) and v.get("speedup") is not None
    }
    for name, fig in other.items():  # the figure the speedup does not use, e.g. host-inclusive beside the GPU time
        lines.append(
            f"{name + ' figure':<11} {fmt(fig['speedup'])}x (reference {fmt(fig.get('reference_ms'))} ms, "
            f"candidate {fmt(fig.get('candidate_ms'))} ms){' - launch-bound' if 'launch_bound' in r.flags else ''}"
        )
    c = r.correctness
    if c.trials:
        lines.append(
            f"correctness {c.passed}/{c.trials} trials, max abs err {fmt(c.max_abs_error)}, max rel err "
            f"{fmt(c.max_rel_error)}, {c.rechecked} timed outputs re-checked"
        )
    if r.flags:
        lines.append(f"flags       {', '.join(r.flags)}")
    if r.message:
        lines.append(f"message     {r.message.splitlines()[0][:300]}")
    env = r.environment
    lines.append(f"environment {env.gpu_name or 'CPU'}, torch {env.torch}, CUDA {env.cuda or '-'}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from cudal1.harness.parent.launcher import prestart
    from cudal1.tasks import load_task_file

    config = config_from_args(args)
    if args.profile:
        config = config.replace(profile="cupti")
    task = load_task_file(args.reference)
    candidate = Candidate(read_text(args.candidate, "candidate"), task_hash=task.hash, label=args.candidate)
    prestart()  # the workers' forkserver imports torch while this process imports the judge
    from cudal1.recorded import RecordedJudge
    from cudal1.store import RunStore

    store = None
    if args.out or args.store:
        if args.out:
            out = out_dir(args.out)
            out.mkdir(parents=True, exist_ok=True)
            store = RunStore(out / "cudal1.sqlite")
        else:
            store = RunStore(args.store)
    try:
        (result,) = RecordedJudge(config, store).judge([(task, candidate)])
        if args.profile == "ncu":  # ncu runs outside the judge, on the files named here
            add_ncu(result, args.reference, args.candidate, quiet=getattr(args, "quiet", False))
            if store is not None and result.profile is not None:
                store.record_evaluation(result)
    finally:
        if store is not None:
            store.close()
    as_user_file(result, args.candidate)
    if getattr(args, "verbose", 0) and not getattr(args, "quiet", False):
        import sys

        from cudal1.cli.progress import judge_detail

        print("\n".join(judge_detail(result, args.verbose)), file=sys.stderr)  # -v: what the judge did; -vv: each call
    if args.json:
        print_json(result.summary())
    else:
        print(describe(result))
        if args.profile:
            from cudal1.profile.text import describe_profiles

            print("\n".join(describe_profiles(result.profile)) if result.profile else
                  "profile     none: the verdict ended before timing (profiles are taken after it)")
    return 0
