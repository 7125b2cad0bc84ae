"""The self-contained HTML report: one file, inline CSS and SVG, no script, nothing fetched.

Contract: :func:`render_html` turns a report document (:mod:`cudal1.report.document`) and the
runs it came from into one HTML page: summary cards and tables (overall, per level, against each
baseline), the plots of :mod:`cudal1.report.plots`, status and flag breakdown with degenerate tasks
and rejected candidates apart, the technique table, and per task the best candidate beside the
reference with a unified diff and the model's analysis, then the environment.  The page links to
nothing outside itself (no ``src``/``href`` to a network address, no web fonts).  Needs the
``report`` extra (jinja2, matplotlib).
"""

from __future__ import annotations

import difflib
import time
from pathlib import Path
from typing import Any

from cudal1 import __version__
from cudal1.report import plots
from cudal1.report.aggregate import FAST_P, fast_p_key
from cudal1.report.document import ENVIRONMENT_KEYS, baseline_label, environment_rows, model_analysis
from cudal1.report.load import RunData
from cudal1.report.markdown import STAT_KEYS, fmt
from cudal1.report.profiles import profile_section
from cudal1.report.verify import CLASSES
from cudal1.speedup import LEGEND, cell

TEMPLATES = Path(__file__).parent / "templates"
MAX_DIFF_LINES = 400


def require_html() -> None:
    """One :class:`~cudal1.extras.MissingExtra` line when jinja2 or matplotlib is missing."""
    from cudal1.extras import require

    require("the HTML report", "jinja2", "matplotlib", extra="report")


def _diff(reference: str, best: str) -> list[tuple[str, str]]:
    lines = list(difflib.unified_diff(reference.splitlines(), best.splitlines(), "reference", "best", lineterm="", n=2))
    out = []
    for line in lines[2:MAX_DIFF_LINES]:  # the two file-name lines say nothing here
        kind = (
            "hunk"
            if line.startswith("@@")
            else "add"
            if line.startswith("+")
            else "del"
            if line.startswith("-")
            else "ctx"
        )
        out.append((kind, line))
    if len(lines) > MAX_DIFF_LINES:
        out.append(("hunk", f"... {len(lines) - MAX_DIFF_LINES} more diff lines"))
    return out


def analysis_check(meta: dict[str, Any]) -> str:
    """One line on the recorded check of the model's Performance Analysis (``meta["analysis_check"]``,
    written by training runs; "" when the candidate has none)."""
    check = meta.get("analysis_check") if isinstance(meta, dict) else None
    if not isinstance(check, dict) or not check.get("present"):
        return ""
    met = [label for key, label in (("names_best", "names the best earlier program"),
                                    ("cites_speedups", "cites measured speedups"), ("reasons", "gives reasons"))
           if check.get(key)]
    score = check.get("score")
    return (f"analysis check: score {fmt(float(score)) if isinstance(score, (int, float)) else '-'}; "
            + ("; ".join(met) if met else "none of: names the best earlier program, cites speedups, gives reasons"))


def task_details(doc: dict[str, Any], data: RunData) -> dict[str, dict[str, Any]]:
    """Per task id: reference and best sources, their diff, and what the policy said of the best:
    a model's Performance Analysis, or the builtin policy's list of the passes it applied
    (``analysis_title`` says which)."""
    by_id = {rec.task.task_id: rec for rec in data.tasks}
    out = {}
    for t in doc["tasks"]:
        rec = by_id[t["task"]]
        best = next((c for c in rec.candidates if c.hash == t["best_candidate"]), None)
        builtin = bool(best) and not model_analysis(best) and bool(best.analysis)  # type: ignore[arg-type]
        out[t["task"]] = {
            "reference": rec.task.source, "best": best.source if best else None,
            "label": best.label if best else "", "analysis": best.analysis if best else "",
            "analysis_title": "Passes the builtin policy applied (its own account, not a model's analysis)"
            if builtin
            else "Model's analysis",
            "analysis_check": analysis_check(best.meta if best else {}),
            "diff": _diff(rec.task.source, best.source) if best else [],
        }
    return out


def _row(s: dict[str, Any]):
    from markupsafe import Markup

    cells = [fmt(s["tasks"]), fmt(s["ok"]), *[fmt(s[k]) for k in STAT_KEYS],
             *[fmt(s["fast_p"][fast_p_key(p)], pct=True) for p in FAST_P]]
    return Markup("".join(f"<td>{Markup.escape(c)}</td>" for c in cells))


def _env_line(env: dict[str, Any] | None) -> str:
    if not env:
        return "environment unknown"
    parts = [env.get("gpu_name") or env.get("device"), env.get("torch") and f"torch {env['torch']}",
             env.get("cuda") and f"CUDA {env['cuda']}", env.get("driver") and f"driver {env['driver']}"]
    return " · ".join(p for p in parts if p)


def audit_levels(audit: dict[str, Any]) -> list[tuple[str, dict[str, int]]]:
    """The audit's class counts as rows (class, {level: count, ..., "all": total over the levels}),
    classes in :data:`~cudal1.report.verify.CLASSES` order, unknown ones after them."""
    levels = audit["per_level"]
    seen = {c for counts in levels.values() for c in counts}
    order = [c for c in CLASSES if c in seen] + sorted(seen - set(CLASSES))
    return [(c, {**{k: counts.get(c, 0) for k, counts in levels.items()},
                 "all": sum(counts.get(c, 0) for counts in levels.values())}) for c in order]


_CONV_NOTES = {
    "all-tasks": "Conventions 'all-tasks': every task, its best verified speedup as measured, a task without one at "
                 "1.0× (the reference stays).",
    "measured": "Conventions 'measured' (solved tasks only): each task's best verified speedup as measured; tasks "
                "without one are left out of the statistics.",
    "cuda-l1": "Conventions 'cuda-l1': a task counts its best speedup only above 1.01×, every other task counts 1.0× "
               "(the reference is kept).",
}


def render_html(doc: dict[str, Any], data: RunData) -> str:
    require_html()
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=False)
    s = doc["summary"]
    audit = doc.get("audit")
    figures = {"distribution": plots.distribution(plots.per_level(doc["tasks"])),
               "baselines": plots.baselines(doc["tasks"], baseline_label),
               "progress": plots.progress(doc["rounds"]) if len(doc["rounds"]) > 1 else "",
               "verdicts": plots.verdicts(s["statuses"], s["flags"]),
               "audit": plots.audit_scatter(audit["records"], audit["slack"]) if audit else ""}
    return env.get_template("report.html.j2").render(
        title=", ".join(doc.get("sources", [])), s=s, levels=doc["levels"], baselines=doc["baselines"],
        others=doc.get("conventions") or {}, tasks=doc["tasks"], techniques=doc["techniques"],
        rejected=doc.get("rejected", []), degenerate=doc.get("degenerate", []), audit=audit,
        audit_levels=audit_levels(audit) if audit else [], class_colors=plots.CLASS_COLORS,
        env_rows=environment_rows(doc.get("environment")), environments=doc.get("environments", []),
        env_keys=ENVIRONMENT_KEYS, runs=doc.get("runs", []), evaluations=doc.get("evaluations", []),
        show_levels=len(doc["levels"]) > 1, blabel=baseline_label, details=task_details(doc, data),
        plots=figures, fast_keys=[fast_p_key(p) for p in FAST_P], row=_row, f=fmt,
        pct=lambda x: fmt(x, pct=True), legend=LEGEND,
        speed=lambda t: cell(t["best_speedup"], t.get("best_ci"), t.get("high_variance", False)),
        ci=lambda c: f"{c[0]:.3g}–{c[1]:.3g}" if c else "-", env_line=_env_line(doc.get("environment")),
        conv_note=_CONV_NOTES.get(s["conventions"], ""), version=__version__, profiles=profile_section(doc, data),
        generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
