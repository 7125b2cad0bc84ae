"""Reporting (apps layer): metrics, technique analysis, verify audits, HTML/JSON/Markdown reports,
exports and comparisons, all read from run stores without writing to them.

Modules: ``aggregate`` (figures over tasks: pure functions and conventions), ``techniques``
(static labels), ``load`` (read-only run reader), ``document`` (the report's JSON document),
``markdown``, ``html`` + ``plots`` + ``templates/`` (the self-contained page; needs the
``report`` extra), ``export`` (CUDA-L1 release format), ``side_by_side`` (``cudal1 compare``),
``verify`` (``cudal1 verify``'s classification), ``builtin`` (the builtin benchmark's figures),
``trackers`` (``optimize --report-to``).
"""

from __future__ import annotations

from cudal1.report.load import ReportError, RunData, load_runs

FORMATS = ("html", "json", "md")

__all__ = ["FORMATS", "ReportError", "RunData", "load_runs", "render_report"]


def render_report(paths: list[str], fmt: str = "html", conventions: str = "all-tasks") -> str:
    """The report of the runs at ``paths`` as HTML, JSON or Markdown text."""
    import json

    from cudal1.report.document import build_report

    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; known: {', '.join(FORMATS)}")
    data = load_runs(paths)
    doc = build_report(data, conventions)
    if fmt == "json":
        return json.dumps(doc, default=str)
    if fmt == "md":
        from cudal1.report.markdown import render_markdown

        return render_markdown(doc)
    from cudal1.report.html import render_html

    return render_html(doc, data)
