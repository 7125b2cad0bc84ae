"""``cudal1 baseline``: time each task's reference under eager, ``torch.compile`` modes and
CUDA-graph replay with the judge's own timer; cached per (task, GPU, torch, config)."""

from __future__ import annotations

import argparse

from cudal1.cli.options import UsageError, add_judge_flags, config_from_args, load_suite, out_dir
from cudal1.cli.output import print_json, table
from cudal1.cli.progress import progress_for
from cudal1.speedup import result_cell

DEFAULT_MODES = "eager,compile-default,compile-reduce-overhead,compile-max-autotune,cudagraph"  # cudal1.compile_modes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("baseline", help="measure eager / torch.compile / CUDA-graph baselines", description=__doc__)
    p.add_argument("--suite", required=True, help="kernelbench:level1, a task dir, JSONL or .py")
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors")
    p.add_argument(
        "--modes",
        default=DEFAULT_MODES,
        help=f"comma-separated, the builtin policy's names (default {DEFAULT_MODES}; also "
        "compile-max-autotune-no-cudagraphs; the old names compile, compile-ro, max-autotune are accepted)",
    )
    p.add_argument("--out", default="runs/baselines", metavar="DIR",
                   help="output directory: config.yaml and the run store, a cache of baselines shared by runs "
                        "(measured once per task, GPU, torch and judge config) (default: runs/baselines)")
    p.add_argument("--json", action="store_true", help="print a JSON object as the last line of stdout")
    add_judge_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cudal1.compile_modes import canonical

    try:  # results are keyed by the vocabulary's names (old ones resolved)
        modes = [canonical(m.strip()) for m in args.modes.split(",") if m.strip()]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    config = config_from_args(args)
    out = out_dir(args.out)
    tasks, _ = load_suite(args, args.suite, args.source)  # bad input is refused before the judge is imported
    from cudal1.config import write_config_file
    from cudal1.harness import DevicePlan
    from cudal1.harness.parent.launcher import prestart
    from cudal1.recorded import JudgeEvent, RecordedJudge
    from cudal1.store import RunStore

    prestart()  # the workers' forkserver imports torch while this process goes on
    plan = DevicePlan.detect(config.device)
    out.mkdir(parents=True, exist_ok=True)
    write_config_file(out, judge=config, run={"command": "baseline", "suite": args.suite, "source": args.source,
                                              "modes": modes, "device": plan.device, "lanes": list(plan.lanes)})
    with RunStore(out / "cudal1.sqlite") as store, progress_for(args, "baselines", len(tasks) * len(modes)) as progress:
        progress.line(f"{len(tasks)} task(s) x {len(modes)} mode(s) on {plan.hardware_name()}; out {out}")
        judge = RecordedJudge(config, store, plan=plan)
        results = judge.baselines(tasks, modes, on_result=lambda r: progress(JudgeEvent("verdict", r.task_name, r)))
    modes = [m for m in modes if any(k[1] == m for k in results)]
    rows, payload = [], []
    for t in tasks:
        got = {m: results.get((t.hash, m)) for m in modes}
        eager = next((r.reference_ms for r in got.values() if r and r.reference_ms), None)
        cells = []
        for m in modes:
            r = got[m]
            cells.append(result_cell(r) if r and r.speedup is not None else (r.status.value if r else "-"))
        rows.append([t.task_id, eager, *cells])
        payload.append({"task": t.task_id, "eager_ms": eager,
                        "modes": {m: (got[m].summary() if got[m] else None) for m in modes}})
    if args.json:
        print_json({"tasks": payload, "device": plan.device})
        return 0
    print(table(["task", "eager ms", *[f"{m} x" for m in modes]], rows))
    return 0
