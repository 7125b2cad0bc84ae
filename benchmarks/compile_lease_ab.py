"""Compiling with the GPU's lease held against released (``EvalConfig.compile_off_lease``): one
batch per arm, from empty caches, several judge workers per GPU.

Each task gets two candidates: its reference under ``torch.compile`` (the builtin's
``compile-default`` chain: a cold compile inside ``construct``/``correctness``) and the reference
as it is (timing load for the other workers).  Prints, per arm, the batch's wall seconds, the
seconds spent compiling with and without the lease, the lease waits, and then every job's speedup
in both arms with whether their 95% intervals overlap (the figures must not move).  Written to
``--out`` as JSON.

    python benchmarks/compile_lease_ab.py kernelbench:level3/3,8,13 kernelbench:level2/43,88,98 \\
        --source $CUDAL1_KERNELBENCH --workers-per-gpu 3 --out ab.json

The arms run one after the other (``--arms``, default released then held): the second finds the
page cache warm but no compile cache of the first.  Arms: ``held`` (compiling keeps the lease),
``released`` (every compile off the lease, autotuning ones included: ``EvalConfig.autotune_off_lease``)
and ``autotune-held`` (compiling off the lease except autotuning compiles, which keep it but for their
waits on compiles elsewhere); ``first-call-exclusive`` is ``released`` with each candidate's whole first
call under the exclusive lease (``EvalConfig.first_call_lease: exclusive``; under ``released`` only its
choices made by timing are), and each arm reports the seconds its jobs held the lease exclusive before
timing.  The first call's two rules on the same tasks:

    python benchmarks/compile_lease_ab.py kernelbench:level2/43,88,98 --source $CUDAL1_KERNELBENCH \\
        --workers-per-gpu 4 --arms released,first-call-exclusive --out first_call_ab.json

``--baseline-modes`` also times the tasks' baselines under those torch.compile modes in each arm,
after its candidates (a baseline's compile holds the lease exclusive where it holds it), the way a
run does:

    python benchmarks/compile_lease_ab.py kernelbench:level3/23,48 --source $CUDAL1_KERNELBENCH \\
        --arms released,autotune-held --baseline-modes compile-max-autotune-no-cudagraphs --out ab.json

``baseline-choosers`` is ``released`` with each torch.compile baseline's construction and first
call under the candidate's rule (``EvalConfig.baseline_lease: choosers``: the shared lease,
exclusive only while a choice is made by timing) instead of the exclusive lease throughout; its
baselines' figures must stay inside the exclusive arm's intervals:

    python benchmarks/compile_lease_ab.py kernelbench:level1/43,93 kernelbench:level3/13,48 \\
        --source $CUDAL1_KERNELBENCH --workers-per-gpu 4 --arms released,baseline-choosers \\
        --baseline-modes compile-max-autotune-no-cudagraphs,compile-max-autotune --out baseline_ab.json

``choices-first`` is ``released`` with the lease's order ``choices-first``
(``EvalConfig.lease_order``, harness/lease.py): a waiter for the exclusive lease to make a
choice by timing (a max-autotune baseline's autotuning steps) stops new holders until it is
served.  Its lease waits and wall against ``released``, figures inside each other's intervals:

    python benchmarks/compile_lease_ab.py kernelbench:level3/23,48 kernelbench:level2/43,88 \\
        --source $CUDAL1_KERNELBENCH --workers-per-gpu 4 --arms released,choices-first \\
        --baseline-modes compile-max-autotune-no-cudagraphs --along --out order_ab.json

(``--along``: the baselines in the candidates' batch, as a run times them, each baseline's
lease waits printed.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from builtin_cost import seconds_in
from cudal1.config import EvalConfig
from cudal1.tasks import load_tasks
from cudal1.types import Candidate, EvalResult

COMPILED = ("\n\nclass ModelNew(Model):\n    def __init__(self, *args):\n        super().__init__(*args)\n"
            "        self.forward = torch.compile(super().forward)\n")
EAGER = "\n\nclass ModelNew(Model):\n    pass\n"


def _pairs(tasks: list) -> list[tuple[Any, Candidate, str]]:
    return [(t, Candidate(t.source + body, task_hash=t.hash, label=label), label)
            for t in tasks for label, body in (("compiled", COMPILED), ("eager", EAGER))]


def _phase_sum(results: list[EvalResult], names: tuple[str, ...]) -> float:
    return sum(seconds_in(r.phase_s, names) for r in results)


# Where compiling holds the GPU's lease, by name (these arms; builtin_kernelbench.py --compile-lease)
LEASE_SETTINGS = {"held": {"compile_off_lease": False, "autotune_off_lease": False},
                  "released": {"compile_off_lease": True, "autotune_off_lease": True},
                  "autotune-held": {"compile_off_lease": True, "autotune_off_lease": False}}
# The arms: those, released with the candidate's whole first call exclusive (fc2bad6 to 8a4c4e8), and
# released with a torch.compile baseline's first call under the candidate's rule (EvalConfig.baseline_lease),
# and released with the lease's order choices-first (EvalConfig.lease_order)
ARM_SETTINGS = {**LEASE_SETTINGS,
                "first-call-exclusive": {**LEASE_SETTINGS["released"], "first_call_lease": "exclusive"},
                "baseline-choosers": {**LEASE_SETTINGS["released"], "baseline_lease": "choosers"},
                "choices-first": {**LEASE_SETTINGS["released"], "lease_order": "choices-first"}}
ARMS = tuple(ARM_SETTINGS)


def _job(r: EvalResult) -> dict[str, Any]:
    """A verdict's figures for the comparison, with its window check's (both sides' slack, the
    excess and its bound) where a GPU timed it."""
    window = (r.figures.get("gpu") or {}).get("window")
    return {"status": r.status.value, "speedup": r.speedup, "ci": list(r.speedup_ci) if r.speedup_ci else None,
            "phase_s": r.phase_s, "message": (r.message or "")[:200], **({"window": window} if window else {})}


def run_arm(arm: str, tasks: list, workers: int, root: Path, budget_s: float, trials: int,
            device: str = "cuda", baseline_modes: tuple[str, ...] = (), along: bool = False) -> dict[str, Any]:
    from cudal1.harness import evaluate_pairs, measure_baselines

    config = EvalConfig(device=device, workers_per_gpu=workers, cache_dir=str(root / arm), keep_samples=False,
                        timing_budget_s=budget_s, timing_trials=trials, **ARM_SETTINGS[arm])
    triples = _pairs(tasks)
    t0 = time.perf_counter()
    if baseline_modes and along:
        return _along(arm, tasks, triples, baseline_modes, config, t0)
    results = evaluate_pairs([(t, c) for t, c, _ in triples], config)
    jobs = {f"{t.name}:{label}": _job(r) for (t, _, label), r in zip(triples, results)}
    base_wall = 0.0
    if baseline_modes:
        t1 = time.perf_counter()
        base = measure_baselines(tasks, list(baseline_modes), config)
        base_wall = time.perf_counter() - t1
        for t in tasks:
            for mode in baseline_modes:
                r = base.get((t.hash, mode))
                if r is not None:
                    jobs[f"{t.name}:baseline {mode}"] = _job(r)
                    results.append(r)
    return _arm_figures(arm, t0, jobs, results, base_wall)


def _arm_figures(arm: str, t0: float, jobs: dict[str, dict], results: list[EvalResult],
                 baselines_wall_s: float = 0.0) -> dict[str, Any]:
    """An arm's record: its wall since ``t0``, every job's figures, and the phase sums over ``results``."""
    return {"arm": arm, "wall_s": time.perf_counter() - t0, "baselines_wall_s": baselines_wall_s, "jobs": jobs,
            "compile_held_s": _phase_sum(results, ("compile",)), "compile_cpu_s": _phase_sum(results, ("compile_cpu",)),
            "lane_s": _phase_sum(results, ("lane",)), "ok": sum(r.status.value == "ok" for r in results),
            "exclusive_s": sum(r.figures.get("exclusive_before_timing_s") or 0.0 for r in results),
            "n": len(results)}


def _along(arm: str, tasks: list, triples: list, modes: tuple[str, ...], config: EvalConfig,
           t0: float) -> dict[str, Any]:
    """``--along``: the baselines and the candidates in one batch, the baselines first (a run's
    ``--baselines-along``): their compiles' GPU steps wait for the lease beside the candidates'
    shared phases."""
    from cudal1.harness.parent.api import DevicePlan, Job, run_jobs

    base = [(t, m) for t in tasks for m in modes]
    results = run_jobs([Job(t, None, m) for t, m in base] + [Job(t, c) for t, c, _ in triples], config,
                       plan=DevicePlan.detect(config.device))
    jobs = {f"{t.name}:baseline {m}": _job(r) for (t, m), r in zip(base, results)}
    lane = {key: seconds_in(j["phase_s"], ("lane",)) for key, j in jobs.items()}  # the baselines' alone
    jobs.update({f"{t.name}:{label}": _job(r) for (t, _, label), r in zip(triples, results[len(base):])})
    return {**_arm_figures(arm, t0, jobs, results), "baseline_lane_s": lane}


def compare(arms: list[dict[str, Any]]) -> list[str]:
    lines = ["arm                   wall_s  of it baselines  jobs  ok  compiling with lease s  compiling off lease s"
             "  lease waits s  exclusive before timing s"]
    for a in arms:
        lines.append(f"{a['arm']:<20}  {a['wall_s']:6.0f}  {a.get('baselines_wall_s', 0.0):15.0f}  {a['n']:4d}  "
                     f"{a['ok']:2d}  {a['compile_held_s']:22.0f}  {a['compile_cpu_s']:21.0f}  {a['lane_s']:13.0f}"
                     f"  {a.get('exclusive_s', 0.0):25.1f}")
    for a in arms:
        for key, lane in a.get("baseline_lane_s", {}).items():
            lines.append(f"  {a['arm']}: {key} waited {lane:.0f} s for the lease")
    if len(arms) == 2:
        first, second = arms
        overlap = within = both = 0
        for key, x in first["jobs"].items():
            y = second["jobs"].get(key)
            if not (y and x["speedup"] and y["speedup"]):
                lines.append(f"  {key}: {x['status']} / {y['status'] if y else '-'}")
                continue
            both += 1
            apart = bool(x["ci"] and y["ci"] and (x["ci"][1] < y["ci"][0] or y["ci"][1] < x["ci"][0]))
            overlap += not apart
            within += abs(x["speedup"] / y["speedup"] - 1) <= 0.01
            lines.append(f"  {key}: {first['arm']} {x['speedup']:.3f}  {second['arm']} {y['speedup']:.3f}"
                         f"{'  (intervals apart)' if apart else ''}")
        lines.append(f"speedups with overlapping 95% intervals: {overlap} of {both}; within 1%: {within} of {both}")
        lines.append(f"wall seconds {first['arm']} {first['wall_s']:.0f} against "
                     f"{second['arm']} {second['wall_s']:.0f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("selectors", nargs="+", help="task selectors (e.g. kernelbench:level3/3,8)")
    ap.add_argument("--source", default=os.environ.get("CUDAL1_KERNELBENCH"), help="KernelBench JSONL")
    ap.add_argument("--workers-per-gpu", type=int, default=3)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the protocol only (nothing is released)")
    ap.add_argument("--arms", default="released,held",
                    help=f"comma-separated, in order: {', '.join(ARMS)}")
    ap.add_argument("--baseline-modes", default="",
                    help="comma-separated torch.compile modes whose baselines each arm also times "
                         "(e.g. compile-max-autotune-no-cudagraphs)")
    ap.add_argument("--along", action="store_true",
                    help="with --baseline-modes: the baselines in the candidates' batch, first, as a run's "
                         "--baselines-along (the arm's wall is that one batch's)")
    ap.add_argument("--timing-budget", type=float, default=2.0)
    ap.add_argument("--timing-trials", type=int, default=50)
    ap.add_argument("--out", default=None, help="write the arms' figures here (JSON)")
    args = ap.parse_args(argv)
    arm_names = [a for a in args.arms.split(",") if a]
    if not arm_names or any(a not in ARMS for a in arm_names):
        ap.error(f"--arms takes {', '.join(ARMS)}")
    modes = tuple(m for m in args.baseline_modes.split(",") if m)
    try:
        tasks = [t for sel in args.selectors for t in load_tasks(sel, source=args.source)]
    except Exception as exc:  # noqa: BLE001 - a bad selector or source: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cudal1-compile-lease-") as tmp:
        arms = []
        for arm in arm_names:
            arms.append(run_arm(arm, tasks, args.workers_per_gpu, Path(tmp), args.timing_budget, args.timing_trials,
                                args.device, modes, args.along))
            print(f"{arm}: {arms[-1]['wall_s']:.0f} s, {arms[-1]['ok']} of {arms[-1]['n']} ok", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(arms, indent=1))
    print("\n".join(compare(arms)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
