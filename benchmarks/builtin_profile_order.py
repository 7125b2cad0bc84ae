"""Does the builtin policy find its best candidates sooner when the reference's profile orders
its passes?  The fixed pass order against the order the measured class asks for, same tasks.

    python benchmarks/builtin_profile_order.py TASKS... [--rounds 3] [--samples 2] [--device cuda]
        [--out runs/profile_order] [--json PATH]

``TASKS`` are ``cudal1 optimize`` selectors (files, folders, ``kernelbench:level1/19``; choose
tasks outside benchmarks/builtin_design_tasks.txt).  Runs ``cudal1 optimize --policy builtin``
twice per selector into ``--out``: ``fixed/`` (the registry's pass order) and ``profile/``
(``--profile``: the reference is profiled once and its class orders the passes, docs/builtin.md),
task by task (``optimize`` takes one selector), each selector in its own folder.  Each run
resumes when its folder exists; cut short (SIGINT), a later call continues it.

A round's samples are judged together, so the cost of reaching a figure is counted in rounds and
in the candidates of those rounds, not in the order verdicts happened to land.  Per task it reads
the run store and prints: the reference's class, and per run the best speedup, the candidates
judged, the round of the first candidate within 2% of that run's best (``best@``), and the round
each run first reached 98% of the lower of the two bests (``same@``: the question "does it find
the same best sooner"; the anchor and repeats not counted).  The table is last; totals are over
tasks finished in both orders with no ``contended`` verdict: geomean best, summed ``same@`` and
the candidates judged through those rounds.  The profiled run also pays for its profiles (one
profiled re-judge of the reference and of each round's best); the table counts candidates, not
seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

WITHIN = 0.98  # "reached the best": a speedup at least this share of the best


def reached(trace: list[tuple[int, float | None]], target: float) -> tuple[int, int] | None:
    """(the round of the first candidate at or above ``target``, the candidates judged in rounds up
    to and including it) for one run's ``(round, speedup)`` trace (speedup ``None``: not ``ok``);
    ``None`` when no candidate reached it."""
    hit = min((rnd for rnd, s in trace if s is not None and s >= target), default=None)
    return None if hit is None else (hit, sum(1 for rnd, _ in trace if rnd <= hit))


def read_run(out: Path) -> dict[str, dict[str, Any]]:
    """Per task name: ``best``, ``judged``, ``trace`` (``[round, speedup or None]`` per distinct
    candidate, judging order), ``finished`` (the run ended on its own), the reference's
    ``class`` and how many verdicts say ``contended`` (timed while another process shared the GPU
    or the host), from a run's store."""
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
            round_of = {c.hash: _round(c.label) for c in store.candidates(task_hash)}
            seen: set[str] = set()
            trace: list[tuple[int, float | None]] = []
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
                trace.append((round_of.get(r.candidate_hash, 0), r.speedup if r.status is Status.OK else None))
            ok = [sp for _, sp in trace if sp is not None]
            rows[task.name] = {"best": max(ok) if ok else None, "judged": len(trace), "trace": trace,
                               "finished": _finished(out), "class": ref_class,
                               "contended": contended}
    return rows


def _finished(out: Path) -> bool:
    """The run ended on its own: its ``summary.json`` exists and says it was not interrupted."""
    try:
        return json.loads((out / "summary.json").read_text()).get("stopped_by") != "interrupted"
    except (OSError, ValueError):
        return False


def _round(label: str) -> int:
    """The search round in a candidate's label (``builtin:r2`` -> 2; 0 when it names none)."""
    tail = label.rpartition(":r")[2]
    return int(tail) if tail.isdigit() else 0


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
    """Per-task rows of both runs, each with ``best_at`` (its own best: round, candidates to it)
    and ``same_at`` (98% of the lower best of the two: round, candidates), and the totals over the
    tasks with a best in both, finished in both and with no ``contended`` verdict in either
    (``contended`` and ``unfinished`` name the tasks left out for those reasons)."""
    names = sorted(set(fixed) | set(profiled))
    tasks: dict[str, dict[str, Any]] = {}
    for n in names:
        runs = {"fixed": fixed.get(n), "profile": profiled.get(n)}
        bests = [r["best"] for r in runs.values() if r and r["best"]]
        tasks[n] = {mode: row if not (row and row["best"]) else
                    {**row, "best_at": reached(row["trace"], WITHIN * row["best"]),
                     "same_at": reached(row["trace"], WITHIN * min(bests)) if len(bests) == 2 else None}
                    for mode, row in runs.items()}
    with_best = [n for n, runs in tasks.items() if all(r and r["best"] for r in runs.values())]
    unfinished = [n for n in with_best if not all(r["finished"] for r in tasks[n].values())]
    shared = [n for n in with_best if n not in unfinished and any(r["contended"] for r in tasks[n].values())]
    both = [n for n in with_best if n not in unfinished and n not in shared]
    modes = ("fixed", "profile")
    return {
        "tasks": tasks,
        "n": len(both),
        "contended": shared,
        "unfinished": unfinished,
        "geomean_best": {m: _geomean([tasks[n][m]["best"] for n in both]) for m in modes},
        "same_rounds": {m: sum(tasks[n][m]["same_at"][0] for n in both) for m in modes},
        "same_judged": {m: sum(tasks[n][m]["same_at"][1] for n in both) for m in modes},
        "judged": {m: sum(tasks[n][m]["judged"] for n in both) for m in modes},
        "better_best": {m: [n for n in both if tasks[n][m]["best"] * WITHIN > tasks[n][_other(m)]["best"]]
                        for m in modes},
    }


def _other(mode: str) -> str:
    return "profile" if mode == "fixed" else "fixed"


def table(report: dict[str, Any]) -> str:
    def at(point: tuple[int, int] | None) -> str:
        return "-" if point is None else f"r{point[0]}/{point[1]}"

    def cell(row: dict[str, Any] | None) -> str:
        if not row or row["best"] is None:
            return f"{'-':>7} {'-':>6} {'-':>6} {'-':>6}"
        mark = "" if row["finished"] else "*"
        return f"{row['best']:6.3f}x {str(row['judged']) + mark:>6} {at(row.get('best_at')):>6} " \
               f"{at(row.get('same_at')):>6}"

    head = f"{'best':>6} {'judged':>6} {'best@':>6} {'same@':>6}"
    lines = [f"{'task':28} {'class':13} | fixed   {head} | profile {head}"]
    for name, runs in report["tasks"].items():
        cls = ((runs["profile"] or {}).get("class") or "-")
        lines.append(f"{name[:28]:28} {cls:13} |         {cell(runs['fixed'])} |         {cell(runs['profile'])}")
    lines.append("best@ / same@: round/candidates judged through it, to the run's own best / to 98% of the lower "
                 "best of the two; * run not finished")
    if report.get("unfinished"):
        lines.append(f"left out, not finished in both orders: {', '.join(report['unfinished'])}")
    if report.get("contended"):
        lines.append(f"left out, timed while the GPU or host was shared (verdicts flagged contended): "
                     f"{', '.join(report['contended'])}")
    if report["n"]:
        g, r, j, b = report["geomean_best"], report["same_rounds"], report["same_judged"], report["better_best"]
        lines.append(f"over {report['n']} task(s) finished in both: geomean best {g['fixed']:.3f}x fixed vs "
                     f"{g['profile']:.3f}x profile; to the same best {r['fixed']} vs {r['profile']} rounds "
                     f"({j['fixed']} vs {j['profile']} candidates); a best over 2% higher: fixed "
                     f"{len(b['fixed'])}, profile {len(b['profile'])}")
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
    try:
        for selector in args.tasks:  # task by task, both orders: a run cut short leaves whole pairs
            for mode in ("fixed", "profile"):
                rc = optimize([selector], args.out / mode, args.rounds, args.samples, args.device, mode == "profile")
                if rc == 130:  # optimize was interrupted (the same SIGINT reaches this process)
                    raise KeyboardInterrupt
                if rc not in (0, 1):  # 1: ran, nothing measured faster
                    print(f"builtin_profile_order: optimize ({mode}, {selector}) exited {rc}", file=sys.stderr)
                    return rc
    except KeyboardInterrupt:  # the optimize run keeps what it judged; report what is there
        print("builtin_profile_order: interrupted; the same command continues the runs", file=sys.stderr)
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
