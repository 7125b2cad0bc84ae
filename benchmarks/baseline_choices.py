"""What a torch.compile baseline chose by timing, under each baseline lease rule
(``EvalConfig.baseline_lease``), repeated from empty caches: where a rule lets a choice be made
beside other GPU work, its choices (and the baseline's figure) move between repetitions.

Per rule and repetition, the tasks' baselines under ``--modes`` are judged in one batch
(``--workers-per-gpu``: each job has neighbours), every task compiling into its own empty cache
(``baseline_cache`` on, a fresh cache root).  Then, from each task's Inductor autotuning cache
(``<cache>/inductor/cache/<system hash>``: operation, input key, precision, the time of every
choice in ms), each autotuned operation's kept choice (the fastest), its best ``aten``/extern
time and its best Triton template time; and the baseline's speedup and the seconds it held the
lease exclusive before timing.  Rule ``alone`` is ``choosers`` with each task judged by itself
(no neighbour): a choice that moves under ``choosers`` but not ``alone`` was made beside a
neighbour's GPU work.  Each job's phase timeline (``JobOutcome.timeline``, seconds from its
batch's start) is kept too, with what its neighbours were doing while it was in phase ``compile``
(the GPU steps of its compile, where its choices are timed) and in its first ``correctness``.

    python benchmarks/baseline_choices.py kernelbench:level1/63 kernelbench:level2/63 \\
        --source $CUDAL1_KERNELBENCH --reps 2 --out $OUT/baseline_choices.json

Prints a table per job and repetition; the JSON has every choice's time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from cudal1.config import EvalConfig
from cudal1.harness.build import baseline_dir
from cudal1.tasks import load_tasks
from cudal1.types import Task

RULES = ("exclusive", "choosers", "alone")


def autotuned_choices(cache: Path) -> list[dict[str, Any]]:
    """Every autotuned operation in an Inductor cache directory: its choices' times (ms), the kept
    one, the best extern (aten) and the best Triton template time.  Choices whose key starts with
    ``triton`` are templates; the others extern kernels."""
    ops: list[dict[str, Any]] = []
    for path in sorted((cache / "cache").glob("*")) if (cache / "cache").is_dir() else []:
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(table, dict) and isinstance(table.get("cache"), dict):
            table = table["cache"]  # torch 2.11's file: {"cache": {operation: ...}}
        for op, by_inputs in table.items() if isinstance(table, dict) else ():
            for path_keys, times in _timings(by_inputs, ()):
                valid = {k: float(v) for k, v in times.items() if v < float("inf")}
                if not valid:
                    continue
                kept = min(valid, key=valid.get)
                extern = [v for k, v in valid.items() if not k.startswith("triton")]
                template = [v for k, v in valid.items() if k.startswith("triton")]
                ops.append({"op": op, "inputs": str(path_keys[0] if path_keys else "")[:120],
                            "precision": "/".join(map(str, path_keys[1:])), "kept": kept[:160],
                            "kept_ms": valid[kept], "extern_ms": min(extern) if extern else None,
                            "template_ms": min(template) if template else None, "times": valid})
    return ops


@contextlib.contextmanager
def recording_timelines() -> Iterator[dict[tuple[str, str], list[tuple[str, float, float]]]]:
    """Each baseline job's phase timeline, by (task hash, mode), while the block runs: the judge's
    job runner (``Evaluator._run``) wrapped, and restored after."""
    from cudal1.harness.parent.evaluator import Evaluator

    timelines: dict[tuple[str, str], list[tuple[str, float, float]]] = {}
    inner = Evaluator._run

    def run(self: Any, job: Any, *args: Any, **kwargs: Any) -> Any:
        outcome = inner(self, job, *args, **kwargs)
        if job.baseline_mode:
            timelines[(job.task.hash, job.baseline_mode)] = list(outcome.timeline)
        return outcome

    Evaluator._run = run  # type: ignore[method-assign]
    try:
        yield timelines
    finally:
        Evaluator._run = inner  # type: ignore[method-assign]


def beside(own: list[tuple[str, float, float]], others: list[list[tuple[str, float, float]]],
           phases: tuple[str, ...] = ("compile", "correctness")) -> dict[str, float]:
    """Seconds of each neighbour phase that overlapped this job's ``phases``, summed over neighbours."""
    seen: dict[str, float] = {}
    for name, a, b in own:
        if name not in phases:
            continue
        for timeline in others:
            for other, c, d in timeline:
                if (overlap := min(b, d) - max(a, c)) > 0:
                    seen[other] = round(seen.get(other, 0.0) + overlap, 3)
    return seen


def _timings(node: Any, keys: tuple) -> list[tuple[tuple, dict[str, float]]]:
    """The (keys on the way, {choice: ms}) tables nested anywhere under ``node``: a dict whose
    values are all numbers is one; other values (strings, lists) are passed over."""
    if not isinstance(node, dict):
        return []
    if node and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in node.values()):
        return [(keys, node)]
    return [found for k, v in node.items() for found in _timings(v, keys + (k,))]


def run_rule(rule: str, tasks: list[Task], modes: list[str], workers: int, root: Path,
             budget_s: float, trials: int, device: str = "cuda") -> list[dict[str, Any]]:
    """One repetition of one rule, from an empty cache root; a row per (task, mode)."""
    from cudal1.harness import measure_baselines
    from cudal1.harness.parent.plan import DevicePlan

    plan = DevicePlan.detect(device)
    config = EvalConfig(device=device, cache_dir=str(root), workers_per_gpu=workers, compile_off_lease=True,
                        baseline_lease="exclusive" if rule == "exclusive" else "choosers", baseline_cache=True,
                        keep_samples=False, timing_budget_s=budget_s, timing_trials=trials)
    batches = [[t] for t in tasks] if rule == "alone" else [tasks]
    rows: list[dict[str, Any]] = []
    for batch in batches:
        t0, start = time.perf_counter(), time.time()
        with recording_timelines() as timelines:
            results = measure_baselines(batch, modes, config, plan=plan)
        wall = time.perf_counter() - t0
        relative = {key: [(name, round(a - start, 3), round(b - start, 3)) for name, a, b in line]
                    for key, line in timelines.items()}
        for task in batch:
            ops = autotuned_choices(baseline_dir(root, task.source, plan.arch_list) / "inductor")
            for mode in modes:
                r, own = results[(task.hash, mode)], relative.get((task.hash, mode), [])
                rows.append({"rule": rule, "task": task.name, "mode": mode, "status": r.status.value,
                             "speedup": r.speedup, "ci": list(r.speedup_ci) if r.speedup_ci else None,
                             "exclusive_s": r.figures.get("exclusive_before_timing_s"), "batch_wall_s": wall,
                             "short_waits": (r.figures.get("cost") or {}).get("short_waits", 0),
                             "gpu_ms": (r.figures.get("gpu") or {}).get("candidate_ms"),
                             "host_ms": (r.figures.get("host") or {}).get("candidate_ms"),
                             "phase_s": r.phase_s, "message": (r.message or "")[:200], "choices": ops,
                             "timeline": own,
                             "beside": beside(own, [v for k, v in relative.items() if k != (task.hash, mode)])})
    return rows


def _ms(value: float | None) -> str:
    return "None" if value is None else f"{round(value, 4)}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'rule':<9} {'rep':>3}  {'task':<34} {'speedup':>8} {'excl s':>7} {'blocked':>7} {'gpu ms':>8} "
             f"{'host ms':>8}  op: kept (ms), best aten / triton"]
    for row in rows:
        speed = f"{row['speedup']:.3f}" if row["speedup"] else row["status"]
        excl = f"{row['exclusive_s']:.1f}" if isinstance(row["exclusive_s"], float) else "-"
        ops = "; ".join(f"{o['op']}: {o['kept'][:40]} ({o['kept_ms']:.4f}), "
                        f"{_ms(o['extern_ms'])} / {_ms(o['template_ms'])}"
                        for o in row["choices"]) or "no autotuned operation"
        gpu, host = _ms(row.get("gpu_ms")), _ms(row.get("host_ms"))
        lines.append(f"{row['rule']:<9} {row['rep']:>3}  {row['task'][:34]:<34} {speed:>8} {excl:>7} "
                     f"{row.get('short_waits') or 0:>7} {gpu:>8} {host:>8}  {ops}")
        if row.get("beside"):
            lines.append(f"{'':<14}neighbours during its compile and correctness: "
                         + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(row["beside"].items(), key=lambda kv: -kv[1])))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tasks", nargs="+", help="task selectors or files (load_tasks)")
    ap.add_argument("--source", default=None, help="the suite's jsonl (KernelBench)")
    ap.add_argument("--modes", default="compile-max-autotune-no-cudagraphs")
    ap.add_argument("--rules", default=",".join(RULES), help=f"comma-separated, of {', '.join(RULES)}")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--workers-per-gpu", type=int, default=2)
    ap.add_argument("--timing-budget", type=float, default=0.5)
    ap.add_argument("--timing-trials", type=int, default=30)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the wiring only (no lease)")
    ap.add_argument("--out", default="baseline_choices.json")
    ap.add_argument("--keep", default="", help="copy each repetition's cache root under this folder")
    args = ap.parse_args(argv)
    rules = [r for r in args.rules.split(",") if r]
    if unknown := [r for r in rules if r not in RULES]:
        print(f"baseline_choices: unknown rule(s) {', '.join(unknown)} (known: {', '.join(RULES)})", file=sys.stderr)
        return 2
    tasks = [t for spec in args.tasks for t in load_tasks(spec, args.source)]
    modes = [m for m in args.modes.split(",") if m]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cudal1-baseline-choices-") as tmp:
        for rep in range(args.reps):
            for rule in rules:
                for row in run_rule(rule, tasks, modes, args.workers_per_gpu, Path(tmp) / f"{rule}-{rep}",
                                    args.timing_budget, args.timing_trials, args.device):
                    rows.append({**row, "rep": rep})
                if args.keep:
                    shutil.copytree(Path(tmp) / f"{rule}-{rep}", Path(args.keep) / f"{rule}-{rep}", dirs_exist_ok=True)
                Path(args.out).write_text(json.dumps(rows, indent=1))  # kept as it goes
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
