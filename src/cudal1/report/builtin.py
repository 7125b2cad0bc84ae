"""The builtin-policy KernelBench benchmark's report and confirmation (``benchmarks/builtin_kernelbench.py``).

Over a finished (or cut-short) run directory of the benchmark, :func:`builtin_report` gives:

- ``success``: tasks with at least one verified (``ok``) builtin candidate;
- speedup over eager: per task the best verified candidate's speedup, 1.0 when none verified
  (the user keeps the reference: CUDA-L1's convention without the 1.01 threshold); mean / median
  / geomean; ``fast_1`` / ``fast_1.5``: share of tasks whose best verified candidate is more
  than 1x / 1.5x faster than eager;
- the same for ``compile-default`` alone (torch.compile's own figure on the same tasks and judge),
  and best over ``compile-default`` where that was verified;
- the same figures on the tasks where ``compile-default`` itself was verified (a paired
  comparison, unaffected by torch.compile failures), and on the stride sample alone when the
  selection also holds tasks chosen because a pass applies;
- with confirmations (:func:`confirm`): each finished task's winner and its torch.compile
  candidate judged once more with fresh inputs outside the run store (``OUT/confirm.json``), and
  the figures again over those re-timed values (removes the best-of-N selection bias; a winner
  failing its re-check counts 1.0 and is listed);
- how often each pass chain won, and the failed verdicts per pass chain.  Degenerate tasks (the
  judge's probe) and unfinished tasks (reference not judged, or candidates sampled but not
  judged) are listed and excluded.

``cudal1 report OUT`` renders the same run store as the general report (HTML, Markdown, JSON).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

from cudal1.config import EvalConfig
from cudal1.policy.builtin import passes_in
from cudal1.report.markdown import fmt as _fmt, md_table
from cudal1.report.aggregate import fast_p, geomean
from cudal1.types import reference_candidate
from cudal1.store import RunStore
from cudal1.types import Status


def fmt(x: float | None, pct: bool = False) -> str:
    return _fmt(x, pct) if pct or x is None else f"{x:.2f}"


def _load_confirmations(out: Path) -> dict[str, dict]:
    path = out / "confirm.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _confirmed_value(c: dict | None) -> float | None:
    """A confirmation's speedup; 1.0 when the re-judged candidate failed (the user keeps the
    reference); None when there was no confirmation."""
    if c is None:
        return None
    return c["speedup"] if c["status"] == "ok" and c["speedup"] else 1.0


def _confirmed_figures(live: list[dict], stats) -> dict | None:
    rows = [r for r in live if r["best_confirmed"] is not None]
    if not rows:
        return None
    paired = [r for r in rows if r["compile_confirmed"] is not None]
    return {"best": stats([_confirmed_value(r["best_confirmed"]) for r in rows]),
            "paired_best": stats([_confirmed_value(r["best_confirmed"]) for r in paired]),
            "paired_compile_default": stats([_confirmed_value(r["compile_confirmed"]) for r in paired]),
            "failed": [r["task"] for r in rows if r["best_confirmed"]["status"] != "ok"]}


def confirm(out: Path, tasks: list, judge: EvalConfig, plan, rows: list[dict], tick=None) -> None:
    """Re-judge each finished task's winner (and its torch.compile default candidate) once more,
    outside the run store: fresh secret inputs, fresh timing.  The best of several noisy
    measurements is biased upward; an independent re-measurement is not.  Results go to
    ``OUT/confirm.json`` one by one (a killed confirmation resumes where it stopped)."""
    from cudal1.harness import evaluate_pairs

    done = _load_confirmations(out)
    by_id = {t.task_id: t for t in tasks}
    store = RunStore(out / "cudal1.sqlite")
    pairs = []
    for r in rows:
        if r["degenerate"] or not r["judged"] or r["pending"] or not r["best_hash"]:
            continue
        task = by_id[r["task"]]
        sources = {c.hash: c for c in store.candidates(task.hash)}
        for h in dict.fromkeys(h for h in (r["best_hash"], r["compile_hash"]) if h):
            if f"{task.task_id}|{h}" not in done:
                pairs.append((task, sources[h]))
    store.close()
    key_of = {(t.hash, c.hash): f"{t.task_id}|{c.hash}" for t, c in pairs}

    def record(res) -> None:
        done[key_of[(res.task_hash, res.candidate_hash)]] = {"status": res.status.value, "speedup": res.speedup,
                                                             "flags": res.flags}
        tmp = out / "confirm.json.tmp"
        tmp.write_text(json.dumps(done, indent=1))
        tmp.replace(out / "confirm.json")
        if tick is not None:
            tick(res)

    if pairs:
        print(f"confirming {len(pairs)} candidate(s) with fresh inputs", flush=True)
        evaluate_pairs(pairs, judge, plan=plan, on_result=record)


def builtin_report(out: Path, tasks: list, judge: EvalConfig, rules_of: dict[str, list[str]] | None = None) -> dict:
    """The builtin benchmark's figures over ``out``'s run store and confirmations (see the module
    docstring); written to ``OUT/report.json`` and returned."""
    store = RunStore(out / "cudal1.sqlite")
    cfg = judge.hash()
    rows = []
    errors_by_pass: Counter = Counter()
    confirmed = _load_confirmations(out)
    for t in tasks:
        anchor = reference_candidate(t).hash
        cands = []
        degenerate = judged = False
        pending = 0
        for c in store.candidates(t.hash):
            r = store.get_evaluation(t.hash, c.hash, cfg)
            if r is None:
                pending += 1
                continue
            degenerate |= "degenerate_task" in r.flags
            if c.hash == anchor:
                judged = True
            else:
                cands.append((passes_in(c.source), r, c.hash))
                if r.status is not Status.OK:
                    errors_by_pass[f"{'+'.join(passes_in(c.source))}: {r.status.value}"] += 1
        ok = [(p, r, h) for p, r, h in cands if r.status is Status.OK and r.speedup]
        best = max(ok, key=lambda prh: prh[1].speedup) if ok else None
        compiled = [(r.speedup, h) for p, r, h in ok if p == ["compile-default"]]
        best_c = confirmed.get(f"{t.task_id}|{best[2]}") if best else None
        comp_c = confirmed.get(f"{t.task_id}|{compiled[0][1]}") if compiled else None
        rows.append({"task": t.task_id, "level": t.level, "rules": (rules_of or {}).get(t.task_id, []),
                     "judged": judged, "rounds": max(store.last_round(t.hash), 0), "pending": pending,
                     "degenerate": degenerate, "candidates": len(cands),
                     "verified": len(ok), "best": best[1].speedup if best else None,
                     "best_passes": "+".join(best[0]) if best else None,
                     "compile_default": compiled[0][0] if compiled else None,
                     "best_hash": best[2] if best else None, "compile_hash": compiled[0][1] if compiled else None,
                     "best_confirmed": best_c, "compile_confirmed": comp_c,
                     "statuses": dict(Counter(r.status.value for _, r, _ in cands))})
    store.close()
    # unfinished tasks (reference never judged, or candidates sampled but not judged when the run
    # was cut short) are left out and listed: counting them as 1.0 would dilute both columns
    unfinished = [r for r in rows if not r["judged"] or r["pending"] or not r["rounds"]]
    live = [r for r in rows if r not in unfinished and not r["degenerate"]]
    over = [r["best"] / r["compile_default"] for r in live if r["best"] and r["compile_default"]]
    paired = [r for r in live if r["compile_default"]]  # torch.compile itself verified on these

    def stats(xs: list[float]) -> dict:
        return {"n": len(xs), "mean": statistics.fmean(xs) if xs else None,
                "median": statistics.median(xs) if xs else None, "geomean": geomean(xs),
                "fast_1": fast_p(xs, 1.0), "fast_1.5": fast_p(xs, 1.5)}

    def figures(sub: list[dict]) -> dict:
        return {"best": stats([r["best"] or 1.0 for r in sub]),
                "compile_default": stats([r["compile_default"] or 1.0 for r in sub])}

    sample = [r for r in live if any(rule == "all" or rule.startswith("stride:") for rule in r["rules"])]
    summary = {"tasks": len(rows), "unfinished": [r["task"] for r in unfinished],
               "degenerate": sum(1 for r in rows if r["degenerate"]),
               "success": sum(1 for r in live if r["verified"]), "judged": len(live),
               "best_over_eager": stats([r["best"] or 1.0 for r in live]),
               "compile_default_over_eager": stats([r["compile_default"] or 1.0 for r in live]),
               "best_over_compile_default": stats(over),
               "paired": figures(paired),  # tasks where torch.compile default itself was verified
               "stride_sample": figures(sample) if sample and len(sample) < len(live) else None,
               "confirmed": _confirmed_figures(live, stats),
               "by_level": {level: figures([r for r in live if r["level"] == level])
                            for level in sorted({r["level"] for r in live}, key=lambda v: (v is None, v or 0))},
               "winning_passes": dict(Counter(r["best_passes"] for r in live if r["best_passes"]).most_common()),
               "failed_verdicts_by_pass": dict(errors_by_pass.most_common()),
               "rows": rows}
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    return summary


def builtin_markdown(s: dict) -> str:
    """The benchmark report as Markdown (tables through :func:`cudal1.report.markdown.md_table`)."""
    figures: list[list[str]] = []

    def line(label: str, st: dict) -> None:
        figures.append([label, str(st["n"]), fmt(st["mean"]), fmt(st["median"]), fmt(st["geomean"]),
                        fmt(st["fast_1"], True), fmt(st["fast_1.5"], True)])

    line("best builtin over eager", s["best_over_eager"])
    line("torch.compile default over eager (1.0 where it failed)", s["compile_default_over_eager"])
    line("best builtin over torch.compile default", s["best_over_compile_default"])
    line("where torch.compile verified: best builtin over eager", s["paired"]["best"])
    line("where torch.compile verified: torch.compile over eager", s["paired"]["compile_default"])
    if s.get("confirmed"):
        c = s["confirmed"]
        line("re-timed with fresh inputs: best builtin over eager", c["best"])
        line("re-timed, where torch.compile verified: best builtin", c["paired_best"])
        line("re-timed, where torch.compile verified: torch.compile", c["paired_compile_default"])
    if s.get("stride_sample"):
        line("stride sample only: best builtin over eager", s["stride_sample"]["best"])
        line("stride sample only: torch.compile default over eager", s["stride_sample"]["compile_default"])
    for level, st in s["by_level"].items():
        b, c = st["best"], st["compile_default"]
        figures.append([f"level {level if level is not None else '-'}: best / compile geomean", str(b["n"]), "", "",
                        f"{fmt(b['geomean'])} / {fmt(c['geomean'])}", fmt(b["fast_1"], True), fmt(b["fast_1.5"], True)])
    rows = []
    for r in s["rows"]:
        state = ("not judged; " if not r["judged"] else "") + ("degenerate; " if r["degenerate"] else "")
        if r["pending"]:
            state += f"{r['pending']} pending; "
        rows.append([r["task"], ",".join(r.get("rules", [])) or "-", str(r["rounds"]), fmt(r["best"]),
                     r["best_passes"] or "-", fmt(r["compile_default"]),
                     f"{fmt(_confirmed_value(r['best_confirmed']))} / {fmt(_confirmed_value(r['compile_confirmed']))}",
                     state + ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))])
    lines = [f"tasks {s['tasks']}: {s['judged']} finished and not degenerate, success {s['success']}; "
             f"degenerate {s['degenerate']}" + (f"; unfinished: {', '.join(s['unfinished'])}" if s["unfinished"] else ""),
             "", md_table(["figure", "n", "mean", "median", "geomean", "fast_1", "fast_1.5"], figures),
             "", "winning passes: " + ", ".join(f"{k} {v}" for k, v in s["winning_passes"].items()),
             "", "failed verdicts by pass: " + (", ".join(f"{k} {v}" for k, v in s["failed_verdicts_by_pass"].items()) or "none")]
    if s.get("confirmed"):
        lines += ["", "winners that failed their re-check: " + (", ".join(s["confirmed"]["failed"]) or "none")]
    lines += ["", md_table(["task", "selected by", "rounds", "best", "passes", "compile-default", "re-timed best / compile",
                            "verdicts"], rows)]
    return "\n".join(lines)
