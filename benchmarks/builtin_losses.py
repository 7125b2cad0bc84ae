"""Where a torch.compile mode beats every builtin chain, and why: the list future passes are chosen
from (``benchmarks/builtin_kernelbench.py`` writes it under ``losses`` in ``OUT/report.json`` and
prints it; ``python benchmarks/builtin_losses.py OUT/report.json --doc docs/builtin.md`` writes its
table into the page, between the ``losses:begin`` / ``losses:end`` markers).

A task is listed when it finished (as the report counts it: judged, nothing pending, not
degenerate) and its best compile mode's baseline verified with a speedup over eager above the
builtin's best (point values, the report's rule; whether the two 95% intervals are apart is said
beside it).  The reason, first that holds:

- ``host``: **the timing figure excludes the host time it saves** — a builtin chain is faster than
  that mode on the host-inclusive figure (``EvalResult.figures["host"]``) but not on the figure
  the run compares (``gpu``: device time, host latency excluded), e.g. a CUDA-graph chain.
- ``slower``: **a pass applies but is slower** — a graph or layout pass (anything but a
  torch.compile mode, an ``inductor[...]`` set or CUDA-graph replay) produced a candidate, and its
  best chain stayed below the mode (or failed: its status is named).
- ``no_pass``: **no pass applies** — the builtin judged only execution passes (torch.compile
  modes, Inductor settings, CUDA graphs) because every graph pass declined (their reasons, from
  the run's rewrite cache, are named where known).

Each row also says whether the winning mode was among the builtin's own chains (when it was not,
the search's two rounds never reached it).  Nothing here judges.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from builtin_figures import counted
from cudal1.compile_modes import COMPILE_CUDAGRAPH, COMPILE_MODES, CUDA_GRAPH

REASONS = {
    "host": "the timing figure excludes the host time it saves",
    "slower": "a pass applies but is slower",
    "no_pass": "no pass applies",
}
BEGIN, END = "<!-- losses:begin -->", "<!-- losses:end -->"


def is_exec_pass(name: str) -> bool:
    """A pass that changes how the forward executes, not what it computes."""
    return name in COMPILE_MODES or name in (CUDA_GRAPH, COMPILE_CUDAGRAPH) or name.startswith("inductor")


def classify(mode: str, mode_figures: dict[str, Any], chains: list[dict[str, Any]],
             declines: dict[str, str] | None = None) -> tuple[str, str]:
    """(reason key, detail) for a task whose compile ``mode`` beat every builtin chain.
    ``mode_figures``: the mode's ``figures`` (``gpu``/``host`` speedups); each chain: ``chain``
    (e.g. ``gemm-3xtf32+compile-default``), ``status``, ``figures``; ``declines``: graph pass ->
    why it declined."""
    host_mode = (mode_figures.get("host") or {}).get("speedup")
    ok = [c for c in chains if c["status"] == "ok"]
    host_wins = [c for c in ok if host_mode and _host(c) > host_mode]
    if host_wins:
        c = max(host_wins, key=lambda c: c["figures"]["host"]["speedup"])
        return "host", (f"{c['chain']}: host-inclusive {c['figures']['host']['speedup']:.2f}x against {mode}'s "
                        f"{host_mode:.2f}x; device time {_gpu(c):.2f}x against {_gpu_of(mode_figures):.2f}x")
    applied = [c for c in chains if not all(is_exec_pass(p) for p in c["chain"].split("+"))]
    if applied:
        good = [c for c in applied if c["status"] == "ok"]
        if good:
            c = max(good, key=_gpu)
            return "slower", f"{c['chain']} {_gpu(c):.2f}x against {mode} {_gpu_of(mode_figures):.2f}x"
        return "slower", "; ".join(f"{c['chain']} {c['status']}" for c in applied)
    why = "; ".join(f"{k}: {v}" for k, v in (declines or {}).items())
    return "no_pass", ("graph passes declined" + (f" ({why})" if why else "")) + \
        "; judged only " + (", ".join(sorted({c["chain"] for c in chains})) or "nothing")


def _host(c: dict[str, Any]) -> float:
    return ((c.get("figures") or {}).get("host") or {}).get("speedup") or 0.0


def _gpu(c: dict[str, Any]) -> float:
    return _gpu_of(c.get("figures") or {}, c.get("speedup"))


def _gpu_of(figures: dict[str, Any], default: float | None = None) -> float:
    return (figures.get("gpu") or {}).get("speedup") or default or 0.0


def loss_rows(out: Path, tasks: list, config_hash: str, rows: list[dict],
              declines: Callable[[str], dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """One entry per finished task where the best compile mode beat every builtin chain
    (``rows``: :func:`builtin_figures.task_rows`); read from the run store in ``out``."""
    from cudal1.policy.builtin import passes_in
    from cudal1.report.load import ReportError, load_runs

    try:
        data = load_runs([out]) if (out / "cudal1.sqlite").exists() else None
    except ReportError:
        data = None
    records = {r.task.hash: r for r in data.tasks} if data else {}
    by_id = {t.task_id: t for t in tasks}
    mine = lambda r: r is not None and (not r.config_hash or r.config_hash == config_hash)  # noqa: E731
    found = []
    for r in rows:
        mode = r["best_mode"]
        if not counted(r) or not mode:
            continue
        if r["mode_status"].get(mode) != "ok" or (r["best_mode_value"] or 0) <= (r["best"] or 1.0):
            continue
        task = by_id[r["task"]]
        rec = records.get(task.hash)
        base = rec.baselines.get(mode) if rec else None
        chains = []
        for c in rec.candidates if rec else []:
            passes = passes_in(c.source)
            if passes and mine(c.result):
                chains.append({"chain": "+".join(passes), "status": c.result.status.value, "speedup": c.result.speedup,
                               "speedup_ci": c.result.speedup_ci, "figures": c.result.figures})
        reason, detail = classify(mode, base.figures if base else {}, chains,
                                  declines(task.source) if declines else None)
        best = max((c for c in chains if c["status"] == "ok"), key=_gpu, default=None)
        apart = bool(best and best.get("speedup_ci") and base and base.speedup_ci
                     and base.speedup_ci[0] > best["speedup_ci"][1])
        found.append({"task": r["task"], "mode": mode, "mode_speedup": r["best_mode_value"], "builtin": r["best"],
                      "builtin_chain": r["best_passes"], "ratio": (r["best"] or 1.0) / r["best_mode_value"],
                      "intervals_apart": apart, "mode_judged_by_builtin": any(c["chain"] == mode for c in chains),
                      "reason": reason, "why": REASONS[reason], "detail": detail})
    return found


def graph_declines(out: Path) -> Callable[[str], dict[str, str]]:
    """Why each graph pass declined a task source, from the run's rewrite cache."""
    from cudal1.policy.builtin_passes import GRAPH_VARIANTS, REWRITES, set_rewrite_cache

    set_rewrite_cache(out / "rewrites")

    def declines(source: str) -> dict[str, str]:
        got = {}
        for v, variant in GRAPH_VARIANTS.items():
            o = REWRITES.get(source, v)
            if not (o.ok and (variant.requires is None or variant.requires in o.applied)):  # type: ignore[attr-defined]
                got[v] = o.error or "nothing to rewrite"  # type: ignore[attr-defined]
        return got

    return declines


def markdown(losses: list[dict[str, Any]], finished: int | None = None) -> str:
    from cudal1.tables import table

    head = (f"Where a compile mode beat every builtin chain: {len(losses)} of {finished} finished tasks"
            if finished is not None else f"Where a compile mode beat every builtin chain: {len(losses)} tasks")
    if not losses:
        return head + "."
    rows = [[x["task"], x["mode"], f"{x['mode_speedup']:.2f}", f"{x['builtin'] or 1.0:.2f}",
             x["builtin_chain"] or "-", f"{x['ratio']:.2f}", "yes" if x["intervals_apart"] else "no",
             "yes" if x["mode_judged_by_builtin"] else "no", x["why"], x["detail"]] for x in losses]
    counts = ", ".join(f"{REASONS[k]} {sum(x['reason'] == k for x in losses)}" for k in REASONS)
    return "\n".join([head + f" ({counts}):", "", table(
        ["task", "best mode", "mode", "builtin", "builtin chain", "ratio", "apart", "mode in builtin", "why",
         "detail"], rows)])


def doc_table(losses: list[dict[str, Any]]) -> str:
    """The losses as a Markdown pipe table (docs/builtin.md)."""
    head = "| task | best compile mode | its speedup | builtin's best | builtin chain | ratio | 95% intervals apart " \
           "| mode among the builtin's chains | why the builtin lost | detail |"
    lines = [head, "|" + "---|" * 10]
    for x in losses:
        detail = re.sub(r"\|", "/", x["detail"])
        lines.append(f"| {x['task']} | {x['mode']} | {x['mode_speedup']:.2f}× | {x['builtin'] or 1.0:.2f}× "
                     f"| {x['builtin_chain'] or '-'} | {x['ratio']:.3f} | {'yes' if x['intervals_apart'] else 'no'} "
                     f"| {'yes' if x['mode_judged_by_builtin'] else 'no'} | {x['why']} | {detail} |")
    return "\n".join(lines)


def write_doc(doc: Path, report: dict[str, Any], source: str) -> None:
    """Replace the text between the markers in ``doc`` with the table of ``report``'s losses."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc} has no {BEGIN} ... {END} section")
    losses = report.get("losses")
    if losses is None:
        raise SystemExit(f"{source} has no losses: run the benchmark (or --report-only) with this version first")
    n = report.get("finished")
    body = (f"Generated by `python benchmarks/builtin_losses.py {source} --doc {doc}`: {len(losses)} of {n} finished "
            f"tasks (environments: {'; '.join(report.get('environments') or []) or '-'}).\n\n" + doc_table(losses))
    before, rest = text.split(BEGIN, 1)
    doc.write_text(before + BEGIN + "\n" + body + "\n" + END + rest.split(END, 1)[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="a run's report.json (benchmarks/builtin_kernelbench.py)")
    ap.add_argument("--doc", default=None, help="write the table into this page between the markers")
    ap.add_argument("--as", dest="label", default=None,
                    help="the report's path as the page names it (e.g. the run it was copied from)")
    args = ap.parse_args()
    report = json.loads(Path(args.report).read_text())
    if args.doc:
        write_doc(Path(args.doc), report, args.label or args.report)
    print(markdown(report.get("losses") or [], report.get("finished")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
