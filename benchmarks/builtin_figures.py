"""The figures of ``benchmarks/builtin_kernelbench.py``: the builtin policy against eager and every
torch.compile mode, per task, per pass and in aggregate, from a run directory alone.

Inputs: the run store (``OUT/cudal1.sqlite``: the policy's candidates and verdicts, and the
baselines — the reference under each torch.compile mode and CUDA-graph replay, timed by the same
judge), ``OUT/confirm.json`` (re-timings with fresh inputs, :mod:`builtin_confirm`) and the task
list.  Only verdicts under the run's judge configuration count.  Definitions:

- **best** (per task): the highest speedup over eager among the policy's verified (``ok``)
  candidates; 1.0 when none verified (the user keeps the reference).  Each **mode** likewise: its
  baseline's speedup, 1.0 when it failed (without a baseline, the policy's own candidate of that
  mode alone, when it was judged).  **best compile mode**: the highest of the torch.compile
  modes (CUDA-graph replay is reported on its own).
- Aggregates over tasks that finished (reference judged, unless the search ran without the anchor:
  ``--no-anchor``; nothing sampled but unjudged, at least
  one policy round, the baselines timed: each mode a verdict or a recorded skip) and are not
  degenerate: mean, median, geomean and fast_p (share of tasks whose
  value is above p, point values) for p = 1, 1.5, 2; per level and overall.
- **over compile-default** / **over the best compile mode**: per task, best / mode, on the tasks
  where that mode verified; geomean, median and the win rate (ratio above 1).  The tasks where the
  builtin lost are listed with their ratio.
- **re-timed**: the same ratios over the confirmation's values (the winner and the best compile
  mode each judged again with fresh inputs; the best of several noisy measurements is biased
  upward, an independent re-measurement is not).  A winner failing its re-check counts 1.0.
- **per pass chain**: how often each chain was judged and verified, its geomean over eager on the
  tasks it verified, against the best compile mode there, and its wins.

Degenerate tasks (the judge's probe), unfinished tasks and tasks without any verified candidate
are named.  Nothing here judges; ``cudal1 report OUT`` renders the same store in general form.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from builtin_baseline_plan import load_done, load_skips
from cudal1.compile_modes import COMPILE_MODES, CUDA_GRAPH
from cudal1.policy.builtin import passes_in
from cudal1.report.load import ReportError, load_runs
from cudal1.tables import fmt as _fmt
from cudal1.tables import table
from cudal1.types import Status

FAST = (1.0, 1.5, 2.0)


def fmt(x: float | None, pct: bool = False) -> str:
    return _fmt(x, pct) if pct or x is None else f"{x:.2f}"


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def stats(xs: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(xs), "mean": statistics.fmean(xs) if xs else None,
                           "median": statistics.median(xs) if xs else None, "geomean": geomean(xs)}
    for p in FAST:
        out[f"fast_{p:g}"] = sum(x > p for x in xs) / len(xs) if xs else None
    return out


def ratios(pairs: list[tuple[str, float, float]]) -> dict[str, Any]:
    """(task, builtin, other) → geomean and median of builtin/other, win rate, the losses."""
    rs = [(t, b / o) for t, b, o in pairs if b and o]
    values = [r for _, r in rs]
    return {
        "n": len(rs), "geomean": geomean(values), "median": statistics.median(values) if values else None,
        "wins": sum(r > 1.0 for r in values),
        "win_rate": sum(r > 1.0 for r in values) / len(values) if values else None,
        "losses": sorted(([t, r] for t, r in rs if r < 1.0), key=lambda tr: tr[1]),
    }


def _ok(result: Any) -> bool:
    return result is not None and result.status is Status.OK and result.speedup is not None


def retimed_key(task_id: str, *, candidate: str | None = None, mode: str | None = None) -> str:
    """A re-timing's key in ``OUT/confirm.json``: ``TASK|CANDIDATE HASH`` for the builtin's winner,
    ``TASK|mode:MODE`` for a compile mode."""
    return f"{task_id}|mode:{mode}" if mode is not None else f"{task_id}|{candidate}"


def _confirmed(c: dict | None) -> float | None:
    if c is None:
        return None
    return c["speedup"] if c["status"] == "ok" and c["speedup"] else 1.0


def retimed_values(live: list[dict]) -> list[tuple[str, float, float | None]]:
    """(task, re-timed best builtin, re-timed best compile mode) of each counted task re-timed at
    all: the builtin's value is its search best where its winner was not re-timed (1.0 where the
    re-check failed), the mode's is None unless its re-timing is ``ok``."""
    return [(r["task"], _confirmed(r["best_confirmed"]) or r["best"] or 1.0,
             _confirmed(r["mode_confirmed"]) if r["mode_confirmed"] and r["mode_confirmed"]["status"] == "ok" else None)
            for r in live if r["best_confirmed"] is not None or r["mode_confirmed"] is not None]


def anchor_judged(out: Path) -> bool:
    """Whether the run's search judges each task's reference as itself (``OUT/config.yaml``'s
    ``search.anchor``; runs recorded before the field existed did)."""
    from cudal1.config import saved_config

    search = (saved_config(out) or {}).get("search") or {}
    return bool(search.get("anchor", True))


def task_rows(out: Path, tasks: list, config_hash: str, rules_of: dict[str, list[str]], modes: list[str]) -> list[dict]:
    """One row per task of the run (see the module docstring for what each field means)."""
    try:
        data = load_runs([out]) if (out / "cudal1.sqlite").exists() else None
    except ReportError:
        data = None  # a store with no verdict yet
    records = {r.task.hash: r for r in data.tasks} if data else {}
    confirmed = json.loads((out / "confirm.json").read_text()) if (out / "confirm.json").exists() else {}
    skips, done = load_skips(out), load_done(out)
    anchored = anchor_judged(out)
    compile_modes = [m for m in modes if m in COMPILE_MODES]
    rows = []
    for t in tasks:
        rec = records.get(t.hash)
        mine = lambda r: r is not None and (not r.config_hash or r.config_hash == config_hash)  # noqa: E731
        ref = rec.reference if rec and mine(rec.reference) else None
        ours = [(passes_in(c.source), c) for c in (rec.candidates if rec else [])]
        cands = [(p, c.result, c.hash, c.round) for p, c in ours if p and c.result is not None and mine(c.result)]
        pending = sum(1 for p, c in ours if p and c.result is None)
        degenerate = any(r and "degenerate_task" in r.flags for r in [ref] + [c[1] for c in cands])
        ok = [(p, r, h) for p, r, h, _ in cands if _ok(r)]
        best = max(ok, key=lambda prh: prh[1].speedup) if ok else None
        base = {m: rec.baselines.get(m) for m in modes} if rec else {}
        base = {m: (r if mine(r) else None) for m, r in base.items()}
        source = {m: "baseline" for m, r in base.items() if r is not None}
        for m in modes:  # no baseline (e.g. --modes none): the policy's own candidate of that mode, if judged
            if base.get(m) is None:
                base[m] = next((r for p, r, _, _ in cands if p == [m]), None)
                if base[m] is not None:
                    source[m] = "search"
        skipped = {m: why for m, why in skips.get(t.task_id, {}).items() if m in modes and base.get(m) is None}
        mode_value = {m: (r.speedup if _ok(r) else (1.0 if r is not None else None)) for m, r in base.items()}
        judged_modes = [m for m in compile_modes if base.get(m) is not None]
        pending_modes = baselines_pending(modes, source, t.task_id in done)
        best_mode = max(judged_modes, key=lambda m: mode_value[m], default=None)
        rows.append({
            "task": t.task_id, "level": t.level, "rules": rules_of.get(t.task_id, []),
            "judged": ref is not None or not anchored, "degenerate": degenerate, "pending": pending,
            "baselines_pending": pending_modes,
            "rounds": max([c[3] or 0 for c in cands], default=0), "candidates": len(cands), "verified": len(ok),
            "best": best[1].speedup if best else None, "best_passes": "+".join(best[0]) if best else None,
            "best_hash": best[2] if best else None,
            "best_ci": list(best[1].speedup_ci) if best and best[1].speedup_ci else None,
            "modes": mode_value, "mode_status": {m: (r.status.value if r else ("skipped" if m in skipped else None))
                                                 for m, r in base.items()},
            "mode_ci": {m: list(r.speedup_ci) for m, r in base.items() if _ok(r) and r.speedup_ci},
            "mode_source": source, "mode_skipped": skipped,
            "best_mode": best_mode, "best_mode_value": mode_value.get(best_mode) if best_mode else None,
            "best_confirmed": confirmed.get(retimed_key(t.task_id, candidate=best[2])) if best else None,
            "mode_confirmed": confirmed.get(retimed_key(t.task_id, mode=best_mode)) if best_mode else None,
            "chains": [("+".join(p), r.status.value, r.speedup if _ok(r) else None) for p, r, _, _ in cands],
            "environments": sorted({f"{r.environment.gpu_name} / torch {r.environment.torch}"
                                    for r in [ref] + [c[1] for c in cands] if r is not None}),
        })
    return rows


def baselines_pending(modes: list[str], source: dict[str, str], done: bool) -> bool:
    """Whether a task's baselines are still to run: the benchmark has not listed it in
    ``OUT/baselines_done.json`` and not every mode has a baseline verdict of its own (``source``;
    runs from before that file).  Until then the modes the search's own candidates stand in for
    are not the task's row."""
    return bool(modes) and not done and any(source.get(m) != "baseline" for m in modes)


def finished(row: dict) -> bool:
    """The task's search is judged (reference, every sampled candidate, at least one round) and its
    baselines have run (or none were asked for)."""
    return row["judged"] and not row["pending"] and bool(row["rounds"]) and not row.get("baselines_pending")


def n_finished(rows: list[dict]) -> int:
    """How many of ``rows`` are :func:`finished`, degenerate ones included (their search and
    baselines ran too: what a run's cost per task divides by)."""
    return sum(1 for r in rows if finished(r))


def counted(row: dict) -> bool:
    """The task enters the figures: finished and not degenerate."""
    return finished(row) and not row["degenerate"]


def summarize(rows: list[dict], modes: list[str]) -> dict[str, Any]:
    unfinished = [r for r in rows if not finished(r)]
    live = [r for r in rows if counted(r)]
    value = lambda r: r["best"] or 1.0  # noqa: E731

    def figures(sub: list[dict]) -> dict[str, Any]:
        fig = {"best": stats([value(r) for r in sub])}
        for m in modes:
            fig[m] = stats([r["modes"].get(m) or 1.0 for r in sub if r["modes"].get(m) is not None])
        fig["best_compile_mode"] = stats([r["best_mode_value"] for r in sub if r["best_mode_value"] is not None])
        return fig

    over = {m: ratios([(r["task"], value(r), r["modes"][m]) for r in live
                       if r["mode_status"].get(m) == "ok" and r["modes"].get(m)]) for m in modes}
    over["best_compile_mode"] = ratios([(r["task"], value(r), r["best_mode_value"]) for r in live
                                        if r["best_mode"] and r["mode_status"].get(r["best_mode"]) == "ok"])
    confirmed = retimed_values(live)
    retimed = {
        "best": stats([best for _, best, _ in confirmed]),
        "over_best_compile_mode": ratios([(t, best, mode) for t, best, mode in confirmed if mode is not None]),
        "failed": [r["task"] for r in live if r["best_confirmed"] and r["best_confirmed"]["status"] != "ok"],
    }
    chains: dict[str, dict[str, Any]] = {}
    for r in live:
        for chain, status, speedup in r["chains"]:
            c = chains.setdefault(chain, {"judged": 0, "ok": 0, "speedups": [], "vs_best_mode": [],
                                          "statuses": Counter()})
            c["judged"] += 1
            c["statuses"][status] += 1
            if speedup:
                c["ok"] += 1
                c["speedups"].append(speedup)
                if r["best_mode_value"] and r["mode_status"].get(r["best_mode"]) == "ok":
                    c["vs_best_mode"].append(speedup / r["best_mode_value"])
    per_chain = {k: {"judged": c["judged"], "ok": c["ok"], "geomean": geomean(c["speedups"]),
                     "over_best_compile_mode": geomean(c["vs_best_mode"]),
                     "wins_over_best_compile_mode": sum(x > 1.0 for x in c["vs_best_mode"]),
                     "compared": len(c["vs_best_mode"]), "statuses": dict(c["statuses"])}
                 for k, c in sorted(chains.items(), key=lambda kv: -kv[1]["judged"])}
    levels = sorted({r["level"] for r in live}, key=lambda v: (v is None, v or 0))
    return {
        "tasks": len(rows), "finished": len(live), "unfinished": [r["task"] for r in unfinished],
        "degenerate": [r["task"] for r in rows if r["degenerate"]],
        "no_verified_candidate": [r["task"] for r in live if not r["verified"]],
        "overall": figures(live),
        "by_level": {str(lv): figures([r for r in live if r["level"] == lv]) for lv in levels},
        "over": over,
        "retimed": retimed,
        "per_chain": per_chain,
        "winning_chains": dict(Counter(r["best_passes"] for r in live if r["best_passes"]).most_common()),
        "environments": sorted({e for r in rows for e in r["environments"]}),
    }


def _stat_row(label: str, s: dict) -> list[str]:
    return [label, str(s["n"]), fmt(s["mean"]), fmt(s["median"]), fmt(s["geomean"])] + \
        [fmt(s[f"fast_{p:g}"], True) for p in FAST]


def markdown(s: dict, modes: list[str], run: dict | None = None, extra: str = "") -> str:
    """The figures as Markdown; the per-task table first, then ``extra`` (the losses and the cost),
    the summary table last (a reader of a terminal sees it without scrolling)."""
    lines = []
    if s.get("rows"):
        rows = [[r["task"], ",".join(r["rules"]) or "-", str(r["rounds"]), fmt(r["best"]), r["best_passes"] or "-"]
                + [fmt(r["modes"].get(m)) if r["mode_status"].get(m) in ("ok", None) else r["mode_status"][m]
                   for m in modes]
                + [f"{fmt(_confirmed(r['best_confirmed']))} / {fmt(_confirmed(r['mode_confirmed']))}",
                   ("degenerate " if r["degenerate"] else "") + (f"{r['pending']} pending" if r["pending"] else "")
                   + ("baselines pending" if r.get("baselines_pending") and not r["pending"] else "")]
                for r in s["rows"]]
        lines += [
            table(
                ["task", "selected by", "rounds", "best", "passes", *modes, "re-timed best / best mode", "note"], rows
            ),
            "",
        ]
    chains = [[k, str(c["judged"]), str(c["ok"]), fmt(c["geomean"]), fmt(c["over_best_compile_mode"]),
               f"{c['wins_over_best_compile_mode']}/{c['compared']}",
               ", ".join(f"{st} {n}" for st, n in sorted(c["statuses"].items()) if st != "ok") or "-"]
              for k, c in s["per_chain"].items()]
    lines += ["Per pass chain (speedups over eager where verified; against the best compile mode on the same task):",
              table(["chain", "judged", "ok", "geomean", "over best compile mode", "wins", "failures"], chains), ""]
    o = s["over"]
    losses = o["best_compile_mode"]["losses"]
    lines += [
        f"tasks {s['tasks']}, finished and not degenerate {s['finished']}; "
        f"degenerate: {', '.join(s['degenerate']) or 'none'}; unfinished: {', '.join(s['unfinished']) or 'none'}; "
        f"no verified builtin candidate: {', '.join(s['no_verified_candidate']) or 'none'}",
        "winning chains: " + (", ".join(f"{k} {v}" for k, v in s["winning_chains"].items()) or "none"),
        "lost to the best compile mode: " + (", ".join(f"{t} {fmt(r)}" for t, r in losses) or "none"),
        "environments: " + ("; ".join(s["environments"]) or "-"),
    ]
    if s.get("rejudged"):  # builtin_rejudge.recorded: tasks whose earlier verdicts were taken out
        lines.append("judged again with the current judge (earlier verdicts in rejudged.jsonl): " + "; ".join(
            f"{e['task']} at {e['at']} ({e['verdicts']} verdicts{', ' + e['reason'] if e['reason'] else ''})"
            for e in s["rejudged"]))
    if s.get("rows"):
        stood_in = sum(1 for r in s["rows"] for src in (r.get("mode_source") or {}).values() if src == "search")
        graphs = sum(len(r.get("mode_skipped") or {}) for r in s["rows"])
        lines.append(f"modes taken from the search's own verdict: {stood_in}; modes not timed because CUDA-graph "
                     f"replay did not pay on the task: {graphs} (benchmarks/builtin_baseline_plan.py)")
    if run:
        lines.append("batches: " + "; ".join(
            f"{b['what']}: {b['jobs']} jobs in {b['wall_s']:.0f} s, device idle {fmt(b['gpu_idle_share'], True)}"
            + ("" if b.get("lanes_unused_share") is None else f", lanes unused {fmt(b['lanes_unused_share'], True)}")
            for b in run.get("batches", [])))
    figure_rows = [_stat_row("best builtin over eager", s["overall"]["best"])]
    figure_rows += [_stat_row(f"{m} over eager (1.0 where it failed)", s["overall"][m]) for m in modes]
    figure_rows.append(_stat_row("best compile mode over eager", s["overall"]["best_compile_mode"]))
    for level, f in s["by_level"].items():
        label = f"level {level}" if level != "None" else "no level"
        figure_rows.append(_stat_row(f"{label}: best builtin", f["best"]))
        figure_rows.append(_stat_row(f"{label}: best compile mode", f["best_compile_mode"]))
    if s["retimed"]["best"]["n"]:
        figure_rows.append(_stat_row("re-timed: best builtin over eager", s["retimed"]["best"]))
    ratio_rows = [[f"builtin over {m if m != 'best_compile_mode' else 'the best compile mode'}", str(r["n"]),
                   fmt(r["geomean"]), fmt(r["median"]), fmt(r["win_rate"], True)] for m, r in o.items()]
    rt = s["retimed"]["over_best_compile_mode"]
    if rt["n"]:
        ratio_rows.append(["re-timed: builtin over best compile mode", str(rt["n"]), fmt(rt["geomean"]),
                           fmt(rt["median"]), fmt(rt["win_rate"], True)])
    if extra:
        lines += ["", extra]
    lines += ["", table(["builtin against", "n", "geomean", "median", "win rate"], ratio_rows), "",
              table(["figure", "n", "mean", "median", "geomean", *(f"fast_{p:g}" for p in FAST)], figure_rows)]
    return "\n".join(lines)


def builtin_figures(out: Path, tasks: list, config_hash: str, rules_of: dict[str, list[str]],
                    modes: list[str] = (*COMPILE_MODES, CUDA_GRAPH)) -> dict[str, Any]:
    """Rows and summary of ``out`` (written to ``OUT/report.json`` and returned)."""
    rows = task_rows(out, tasks, config_hash, rules_of, list(modes))
    summary = summarize(rows, list(modes)) | {"rows": rows, "modes": list(modes)}
    (out / "report.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
