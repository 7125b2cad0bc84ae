"""Does the builtin policy find its best candidates sooner when the reference's profile orders
its passes?  The fixed pass order against the order the measured class asks for, same tasks.

    python benchmarks/builtin_profile_order.py TASKS... [--rounds 3] [--samples 2] [--device cuda]
        [--out runs/profile_order] [--json PATH]

``TASKS`` are ``cudal1 optimize`` selectors (files, folders, ``kernelbench:level1/19``; choose
tasks outside benchmarks/builtin_design_tasks.txt).  Runs ``cudal1 optimize --policy builtin``
twice per selector into ``--out``: ``fixed/`` (the registry's pass order) and ``profile/``
(``--profile``: the reference is profiled once and its class orders the passes, docs/builtin.md),
task by task (``optimize`` takes one selector), each selector in its own folder.  Each run
resumes when its folder exists; cut short (SIGINT), a later call continues it.  Per task it reads the run store and
prints: the reference's class, and per run the best speedup, the candidates judged, and the
candidates judged until the first one within 2% of that run's best (``to best``: the anchor and
repeats not counted).  The table is last; totals compare the runs' geomean best and their summed
``to best``.  The profiled run also pays for its profiles (one profiled re-judge of the reference
and of each round's best); the table counts candidates, not seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

WITHIN = 0.98  # "reached the best": a speedup at least this share of the run's best


def to_best(speedups: list[float | None]) -> tuple[float | None, int]:
    """(the best speedup, how many candidates were judged until the first within ``WITHIN`` of it)
    for one task's candidates in judging order (``None``: not ``ok``); (None, 0) with none ``ok``."""
    ok = [s for s in speedups if s is not None]
    if not ok:
        return None, 0
    best = max(ok)
    return best, next(i + 1 for i, s in enumerate(speedups) if s is not None and s >= WITHIN * best)


def read_run(out: Path) -> dict[str, dict[str, Any]]:
    """Per task name: best, judged, to_best, the reference's class and how many verdicts say
    ``contended`` (timed while another process shared the GPU or the host), from a run's store."""
    from cudal1.store import RunStore
    from cudal1.types import Status, reference_candidate

    rows: dict[str, dict[str, Any]] = {}
    if not (out / "cudal1.sqlite").exists():  # the run never started (cut before it)
        return rows
    with RunStore(out / "cudal1.sqlite") as store:
        by_task: dict[str, list] = {}
        for result in store.evaluations():
            by_task.setdefault(result.task_hash, []).append(result)
        for task_hash, results in by_task.items():
            task = store.get_task(task_hash)
            if task is None:
                continue
            anchor = reference_candidate(task).hash
            seen: set[str] = set()
            speedups: list[float | None] = []
            ref_class = ""
            contended = sum(1 for r in results if "contended" in r.flags)  # the GPU or host was shared
            for r in results:
                if r.candidate_hash == anchor:
                    if r.profile is not None and r.profile.reference.bound is not None:
                        ref_class = r.profile.reference.bound.value
                    continue
                if r.candidate_hash in seen:  # a profiled re-judge of a candidate already counted
                    continue
                seen.add(r.candidate_hash)
                speedups.append(r.speedup if r.status is Status.OK else None)
            best, reached = to_best(speedups)
            rows[task.name] = {"best": best, "judged": len(speedups), "to_best": reached, "class": ref_class,
                               "contended": contended}
    return rows


def optimize(selectors: list[str], out: Path, rounds: int, samples: int, device: str, profile: bool) -> int:
    """``cudal1 optimize`` once per selector (it takes one), each into its own folder under ``out``;
    the worst exit code."""
    worst = 0
    for selector in selectors:
        cmd = [sys.executable, "-m", "cudal1.cli.main", "optimize", selector, "--policy", "builtin", "--rounds",
               str(rounds), "--samples", str(samples), "--device", device, "--out", str(run_dir(out, selector)),
               "--json"]
        rc = subprocess.run(cmd + (["--profile"] if profile else []), stdout=subprocess.DEVNULL).returncode
        if rc not in (0, 1):  # 1: ran, nothing measured faster
            return rc
        worst = max(worst, rc)
    return worst


def run_dir(out: Path, selector: str) -> Path:
    """The run folder of one selector under ``out``."""
    return out / "".join(c if c.isalnum() or c in "-_." else "_" for c in selector)


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def compare(fixed: dict[str, dict[str, Any]], profiled: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per-task rows of both runs and the totals over tasks with a best in both and no
    ``contended`` verdict in either (``contended``: the tasks left out for that)."""
    names = sorted(set(fixed) | set(profiled))
    with_best = [n for n in names if (fixed.get(n) or {}).get("best") and (profiled.get(n) or {}).get("best")]
    shared = [n for n in with_best if fixed[n].get("contended") or profiled[n].get("contended")]
    both = [n for n in with_best if n not in shared]
    return {
        "tasks": {n: {"fixed": fixed.get(n), "profile": profiled.get(n)} for n in names},
        "n": len(both),
        "contended": shared,
        "geomean_best": {"fixed": _geomean([fixed[n]["best"] for n in both]),
                         "profile": _geomean([profiled[n]["best"] for n in both])},
        **{key: {"fixed": sum(fixed[n][key] for n in both), "profile": sum(profiled[n][key] for n in both)}
           for key in ("to_best", "judged")},
    }


def table(report: dict[str, Any]) -> str:
    def cell(row: dict[str, Any] | None) -> str:
        if not row or row["best"] is None:
            return f"{'-':>7} {'-':>6} {'-':>8}"
        return f"{row['best']:6.3f}x {row['judged']:6d} {row['to_best']:8d}"

    lines = [f"{'task':32} {'class':13} | {'fixed':>7} {'judged':>6} {'to best':>8} | {'profile':>7} {'judged':>6} "
             f"{'to best':>8}"]
    for name, runs in report["tasks"].items():
        cls = ((runs["profile"] or {}).get("class") or "-")
        lines.append(f"{name[:32]:32} {cls:13} | {cell(runs['fixed'])} | {cell(runs['profile'])}")
    g, t, j = report["geomean_best"], report["to_best"], report["judged"]
    if report.get("contended"):
        lines.append(f"left out, timed while the GPU or host was shared (verdicts flagged contended): "
                     f"{', '.join(report['contended'])}")
    if report["n"]:
        lines.append(f"over {report['n']} task(s) with a best in both: geomean best {g['fixed']:.3f}x vs "
                     f"{g['profile']:.3f}x; judged until the best {t['fixed']} vs {t['profile']}; judged {j['fixed']} "
                     f"vs {j['profile']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tasks", nargs="+", help="cudal1 optimize selectors")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path("runs/profile_order"))
    ap.add_argument("--json", type=Path, default=None, help="write the comparison here")
    args = ap.parse_args(argv)
    for selector in args.tasks:  # task by task, both orders: a run cut short leaves whole pairs
        for mode in ("fixed", "profile"):
            rc = optimize([selector], args.out / mode, args.rounds, args.samples, args.device, mode == "profile")
            if rc not in (0, 1):  # 1: ran, nothing measured faster
                print(f"builtin_profile_order: optimize ({mode}, {selector}) exited {rc}", file=sys.stderr)
                return rc
    runs = {mode: {name: row for selector in args.tasks
                   for name, row in read_run(run_dir(args.out / mode, selector)).items()}
            for mode in ("fixed", "profile")}
    report = compare(runs["fixed"], runs["profile"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
