"""The report's figures as inline SVG text, drawn with matplotlib (the ``report`` extra).

Contract: each function takes the report document (and, for the distribution, the per-level
speedups) and returns one ``<svg>`` element as a string, or ``""`` when there is nothing to draw.
Text stays text (``svg.fonttype = none``), ids are salted per figure so several SVGs can live in
one page, and nothing refers to an outside resource.  Only ``matplotlib.figure.Figure`` is used
(no pyplot, no global backend switch), so rendering is safe inside a library call.
"""

from __future__ import annotations

import io
import re
from typing import Any, Callable

from cudal1.report.aggregate import level_key

_STATUS_COLORS = {"ok": "#2e7d32", "incorrect": "#ef6c00", "compile_error": "#6d4c41", "runtime_error": "#c62828",
                  "timeout": "#7b1fa2", "rejected": "#000000"}
# verify's audit classes (cudal1.report.verify.CLASSES); other classes get grey
CLASS_COLORS = {"verified": "#2e7d32", "slower_than_claimed": "#ef6c00", "degenerate_task": "#6a1b9a",
                "incorrect": "#c62828", "failed": "#6d4c41", "rejected": "#000000", "missing_code": "#9e9e9e"}
_PALETTE = ["#1565c0", "#ef6c00", "#2e7d32", "#c62828", "#6a1b9a", "#00838f", "#9e9d24", "#5d4037"]


def _svg(fig: Any, salt: str) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML declaration and DOCTYPE
    # sized by the page: keep the aspect ratio, let CSS set the width
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 class="plot"', text, count=1)


def _log_axis(ax: Any) -> None:
    """Log scale with plain tick labels (0.5×, 1×, 2×) instead of powers of ten; call it after
    plotting.  A narrow range (less than 4× top to bottom, e.g. one task at 1.75×) gets denser
    ticks and a little headroom, so every point sits between labelled ticks."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    narrow = lo > 0 and hi / lo < 4
    if narrow:
        ax.set_ylim(lo / 1.15, hi * 1.15)
    subs = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0) if narrow else (1.0, 2.0, 5.0)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=96)
    fig.set_facecolor("white")
    return fig


def distribution(per_level: dict[str, list[float]]) -> str:
    """Per-task best speedup over eager, one column of points and a box per level, log scale."""
    groups = [(k, v) for k, v in per_level.items() if v]
    if not groups:
        return ""
    import random

    fig = _figure(7.5, 3.6)
    ax = fig.add_subplot()
    rng = random.Random(0)
    for i, (_, values) in enumerate(groups):
        ax.boxplot([values], positions=[i], widths=0.5, showfliers=False, medianprops={"color": "#c62828"})
        ax.scatter(
            [i + rng.uniform(-0.18, 0.18) for _ in values], values, s=10, alpha=0.6, color=_PALETTE[i % len(_PALETTE)]
        )
    ax.axhline(1.0, color="#888", lw=0.8, ls="--")
    _log_axis(ax)
    ax.set_xticks(range(len(groups)), [f"{k}\n(n={len(v)})" for k, v in groups])
    ax.set_ylabel("best speedup over eager (log)")
    ax.grid(axis="y", which="both", alpha=0.25)
    return _svg(fig, "dist")


def baselines(tasks: list[dict[str, Any]], label: Callable[[str], str] = str) -> str:
    """Each task's best speedup beside its measured baselines' speedups (all over eager), tasks
    sorted by best speedup; log scale; ``label`` names a baseline in the legend."""
    rows = sorted((t for t in tasks if t["best_speedup"] and not t["degenerate"]), key=lambda t: t["best_speedup"])
    if not rows:
        return ""
    modes = sorted({m for t in rows for m in t["baselines"]})
    fig = _figure(7.5, 3.8)
    ax = fig.add_subplot()
    xs = range(len(rows))
    ax.plot(xs, [t["best_speedup"] for t in rows], "o", ms=4, color=_PALETTE[0], label="best candidate")
    for j, m in enumerate(modes):
        pts = [(i, t["baselines"][m]) for i, t in enumerate(rows) if m in t["baselines"]]
        ax.plot(
            [p[0] for p in pts], [p[1] for p in pts], "x", ms=5, color=_PALETTE[(j + 1) % len(_PALETTE)], label=label(m)
        )
    ax.axhline(1.0, color="#888", lw=0.8, ls="--")
    _log_axis(ax)
    ax.set_ylabel("speedup over eager (log)")
    if len(rows) <= 40:
        ax.set_xticks(list(xs), [t["task"] for t in rows], rotation=70, fontsize=7)
    else:
        ax.set_xlabel(f"{len(rows)} tasks with a verified candidate, by best speedup")
        ax.set_xticks([])
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=2, frameon=False)  # above: no point hidden
    ax.grid(axis="y", which="both", alpha=0.25)
    return _svg(fig, "base")


def progress(rounds: list[dict[str, Any]]) -> str:
    """Geomean of the best speedup so far (1.0 where none) and tasks with a verified candidate, per round."""
    if not rounds:
        return ""
    fig = _figure(7.5, 3.0)
    ax = fig.add_subplot()
    xs = [r["round"] for r in rounds]
    ax.plot(xs, [r["geomean_best_so_far"] or 1.0 for r in rounds], "o-", color=_PALETTE[0])
    ax.set_xlabel("round")
    ax.set_ylabel("geomean best so far", color=_PALETTE[0])
    ax.set_xticks(xs)
    ax2 = ax.twinx()
    ax2.bar(xs, [r["tasks_with_ok"] for r in rounds], alpha=0.2, color=_PALETTE[2], width=0.5)
    from matplotlib.ticker import MaxNLocator

    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_ylabel("tasks with a verified candidate", color=_PALETTE[2])
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    return _svg(fig, "prog")


def verdicts(statuses: dict[str, int], flags: dict[str, int]) -> str:
    """Horizontal bars: candidates per status, and per flag."""
    if not statuses:
        return ""
    fig = _figure(7.5, 0.9 + 0.22 * max(len(statuses), len(flags), 3))
    ax1 = fig.add_subplot(1, 2, 1)
    names = list(statuses)[::-1]
    ax1.barh(names, [statuses[n] for n in names], color=[_STATUS_COLORS.get(n, "#607d8b") for n in names])
    ax1.set_title("statuses", fontsize=10)
    ax2 = fig.add_subplot(1, 2, 2)
    if flags:
        fnames = list(flags)[::-1]
        ax2.barh(fnames, [flags[n] for n in fnames], color="#607d8b")
    ax2.set_title("flags", fontsize=10)
    from matplotlib.ticker import MaxNLocator

    for ax in (ax1, ax2):
        ax.tick_params(labelsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # counts
    fig.subplots_adjust(wspace=0.6)
    return _svg(fig, "verd")


def audit_scatter(records: list[dict[str, Any]], slack: float) -> str:
    """Claimed against measured speedup of the verify records holding both (log-log), coloured by
    audit class, with the y = x line and the y = slack·x line (below it: ``slower_than_claimed``)."""
    pts = [r for r in records if r["claimed"] and r["measured"] and r["claimed"] > 0 and r["measured"] > 0]
    if not pts:
        return ""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig = _figure(6.4, 5.2)
    ax = fig.add_subplot()
    present = {r["class"] for r in pts}
    for cls in [c for c in CLASS_COLORS if c in present] + sorted(present - set(CLASS_COLORS)):
        mine = [r for r in pts if r["class"] == cls]
        ax.scatter([r["claimed"] for r in mine], [r["measured"] for r in mine], s=18, alpha=0.75, linewidths=0.4,
                   edgecolors="white", color=CLASS_COLORS.get(cls, "#607d8b"), label=f"{cls} ({len(mine)})", zorder=3)
    values = [v for r in pts for v in (r["claimed"], r["measured"])]
    lo, hi = min(values + [1.0]) / 1.25, max(values + [1.0]) * 1.25
    ax.plot([lo, hi], [lo, hi], color="#555", lw=0.9, label="measured = claimed", zorder=2)
    ax.plot(
        [lo, hi],
        [slack * lo, slack * hi],
        color="#555",
        lw=0.9, ls="--", label=f"measured = {slack:g} × claimed", zorder=2,
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    subs = (1.0, 2.0, 5.0) if hi / lo <= 300 else (1.0, 3.0)  # wide ranges: 1×, 3×, 10×, 30× ... stay apart
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=subs))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("claimed speedup (log)")
    ax.set_ylabel("measured speedup (log)")
    ax.grid(which="major", alpha=0.25)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    return _svg(fig, "audit")


def per_level(tasks: list[dict[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for t in sorted(tasks, key=lambda t: (t["level"] is None, t["level"] or 0)):
        if t["best_speedup"] and not t["degenerate"]:
            out.setdefault(level_key(t["level"]), []).append(t["best_speedup"])
    return out
