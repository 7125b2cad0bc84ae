"""Markdown rendering of a report document (terminals, CI logs, pull requests).

``md_table`` is the one Markdown table helper of the package (the builtin benchmark's report and
``cudal1 compare --format md`` use it too); cells go through :func:`cudal1.tables.fmt`, as every table's do.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from cudal1.report.aggregate import FAST_P, fast_p_key
from cudal1.report.document import ENVIRONMENT_KEYS, baseline_label, environment_rows
from cudal1.report.verify import CLASSES
from cudal1.speedup import LEGEND, cell
from cudal1.tables import fmt

STAT_KEYS = ("mean", "median", "geomean", "max", "p25", "p75")


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells pass through :func:`fmt` unless already strings
    (``|`` inside cells is escaped)."""
    def cell(c: Any) -> str:
        return (c if isinstance(c, str) else fmt(c)).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def figure_headers() -> list[str]:
    return ["tasks", "ok", *STAT_KEYS, *[f"fast_{fast_p_key(p)}" for p in FAST_P]]


def figure_cells(s: dict[str, Any]) -> list[str]:
    return [fmt(s["tasks"]), fmt(s["ok"]), *[fmt(s[k]) for k in STAT_KEYS],
            *[fmt(s["fast_p"][fast_p_key(p)], pct=True) for p in FAST_P]]


def audit_markdown(audit: dict[str, Any]) -> list[str]:
    """The audit of a verify run (``doc["audit"]``): class counts per level, then one row per
    record (task | class | claimed | measured | ratio | flags)."""
    levels = audit.get("per_level") or {}
    seen = {c for counts in levels.values() for c in counts}
    classes = [c for c in CLASSES if c in seen] + sorted(seen - set(CLASSES))
    out = ["## Audit against published claims", "",
           f"{len(audit.get('records') or [])} records of `{audit.get('file') or 'the release'}`; verified when "
           f"measured >= {audit['slack']:g} x claimed; ratio = measured / claimed.", ""]
    out.append(
        md_table(
            ["class", *levels, "all"],
            [
                [c, *[counts.get(c, 0) for counts in levels.values()], sum(n.get(c, 0) for n in levels.values())]
                for c in classes
            ],
        )
        if classes
        else "No class counts."
    )
    out += ["", md_table(["task", "class", "claimed", "measured", "ratio", "flags"],
                         [[r["task"], r["class"], r["claimed"], r["measured"], r["ratio"], ", ".join(r["flags"]) or "-"]
                          for r in audit.get("records") or []])]
    return out


def evaluation_markdown(e: dict[str, Any]) -> list[str]:
    """One ``cudal1 evaluate`` run's rates, pass@k and fast_p (``doc["evaluations"]`` entry)."""
    fast = e.get("fast_p") or {}
    headers = [
        "tasks", "samples per task", "samples", "compiled", "correct", "ok", *e["pass"],
        *[f"fast_{p}" for p in fast],
    ]
    row = [e.get("tasks"), e.get("samples_per_task"), e.get("samples"), fmt(e.get("compile_rate"), pct=True),
           fmt(e.get("correct_rate"), pct=True), fmt(e.get("ok_rate"), pct=True),
           *[fmt(v, pct=True) for v in e["pass"].values()], *[fmt(v, pct=True) for v in fast.values()]]
    out = [f"## Evaluation: {e.get('run')}" + ("" if e.get("complete") else " (incomplete: rerun it to ask again)"), "",
           md_table(headers, [row])]
    if e.get("speedup"):
        out += ["", "Best-of-k speedup: " + "; ".join(f"{k} {fmt(v) if isinstance(v, float) else v}"
                                                    for k, v in e["speedup"].items())]
    return out


def render_markdown(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    env = doc.get("environment") or {}
    out = [
        f"# cudal1 report: {', '.join(doc.get('sources', []))}",
        "",
        f"Conventions: `{s['conventions']}`. Degenerate tasks ({s['degenerate']}) are left out of every figure; "
        f"{s['candidates']} candidates judged; rejected: {s['statuses'].get('rejected', 0)}.",
        f"Faster than the reference with confidence (95% CI above 1.0): {s['faster']} task(s); by the point value "
        f"alone: {s['faster_point']}. fast_p counts the first kind; KernelBench's point-value fast_p: "
        + ", ".join(f"fast_{k} {fmt(v, pct=True)}" for k, v in s["fast_p_point"].items())
        + ".",
        "",
        "## Summary",
        "",
        md_table(
            ["group", *figure_headers()],
            [["all", *figure_cells(s)]]
            + ([[k, *figure_cells(v)] for k, v in doc["levels"].items()] if len(doc["levels"]) > 1 else []),
        ),
    ]
    for e in doc.get("evaluations") or []:
        out += ["", *evaluation_markdown(e)]
    for name, other in (doc.get("conventions") or {}).items():
        out += ["", f"Under the `{name}` conventions: " + ", ".join(f"{k} {fmt(other[k])}" for k in ("n", *STAT_KEYS))]
    if doc["baselines"]:
        out += [
            "",
            "## Against baselines",
            "",
            md_table(
                ["baseline", "tasks", "ok", "geomean", "median", "fast_1.0", "baseline geomean over eager"],
                [
                    [
                        baseline_label(m), fmt(b["tasks"]), fmt(b["ok"]), fmt(b["geomean"]), fmt(b["median"]),
                        fmt(b["fast_p"]["1.0"], pct=True), fmt(b["baseline_over_eager"]["geomean"]),
                    ]
                    for m, b in doc["baselines"].items()
                ],
            ),
        ]
    out += ["", "## Verdicts", "", "statuses: " + (", ".join(f"{k} {v}" for k, v in s["statuses"].items()) or "none"),
            "", "flags: " + (", ".join(f"{k} {v}" for k, v in s["flags"].items()) or "none")]
    if doc["techniques"]:
        out += ["", "## Techniques", "", md_table(["technique", "candidates", "verified", "tasks", "median speedup"],
                                                  [[t, v["candidates"], v["verified"], v["tasks"], v["median_speedup"]]
                                                   for t, v in doc["techniques"].items()])]
    if len(doc.get("rounds") or []) > 1:
        out += [
            "",
            "## Search progress",
            "",
            md_table(
                ["round", "candidates", "ok", "tasks with ok", "geomean best so far"],
                [
                    [r["round"], r["candidates"], r["ok"], r["tasks_with_ok"], r["geomean_best_so_far"]]
                    for r in doc["rounds"]
                ],
            ),
        ]
    out += [
        "",
        "## Tasks",
        "",
        f"best x: {LEGEND}. judged: candidates with a verdict, the reference not counted. "
        "Techniques: `cudal1 analyze FILE --reference TASK`'s labels of the best.",
        "",
        md_table(
            ["task", "best x", "judged", "verdicts", "techniques of the best"],
            [
                [
                    t["task"],
                    "degenerate"
                    if t["degenerate"]
                    else cell(t["best_speedup"], t.get("best_ci"), t.get("high_variance", False)),
                    t["candidates"],
                    ", ".join(f"{k} {v}" for k, v in t["statuses"].items()),
                    ", ".join(t["techniques"]) or "-",
                ]
                for t in doc["tasks"]
            ],
        ),
    ]
    if doc.get("rejected"):
        out += [
            "",
            "## Rejected candidates",
            "",
            md_table(
                ["task", "candidate", "flags", "message"],
                [[r["task"], r["candidate"][:12], ",".join(r["flags"]), r["message"][:120]] for r in doc["rejected"]],
            ),
        ]
    if doc.get("audit"):
        out += ["", *audit_markdown(doc["audit"])]
    out += ["", "## Environment", "", md_table(["setting", "value"], environment_rows(env)) if env else "unknown"]
    envs = doc.get("environments") or []
    if len(envs) > 1:
        keys = [k for k in ENVIRONMENT_KEYS if len({str(e.get(k)) for e in envs}) > 1]
        out += [
            "",
            f"These runs hold {len(envs)} environments (differing in {', '.join(keys)}); the table shows the "
            "most common:",
            "",
            md_table([*keys, "verdicts"], [[*(str(e.get(k)) for k in keys), e["verdicts"]] for e in envs]),
        ]
    return "\n".join(out) + "\n"
