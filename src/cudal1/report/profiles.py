"""The report's kernel profiles: per task, the reference's and the best candidate's kernel time as
stacked bars, and a roofline-style plot of the suite.

Contract: :func:`profile_section` reads the profiles recorded with the verdicts of a report's
runs (``judge --profile``, ``optimize --profile``) and returns what the template partial
``profiles.html.j2`` shows: ``{"roofline": svg, "tasks": [{"task", "anchor", "bars": svg,
"reference": line, "best": line}], "note": str}``; no task with a profile gives an empty list
and no plots.  Per task, the reference's profile comes from the clean worker (the anchor's
verdict, else any verdict of the task), the best's from the best candidate's own process (its
report: information only).  The roofline puts each program at its arithmetic intensity (the
task's FLOPs per byte moved) and achieved FLOP/s, under the device's two ceilings (peak
bandwidth x intensity, and the peak FLOP/s of the call's dtype) when the profiles carry them; on
the CPU there are no ceilings, only the points.  Needs matplotlib (the ``report`` extra).
"""

from __future__ import annotations

from typing import Any

from cudal1.profile.model import ProgramProfile
from cudal1.profile.text import headline, short
from cudal1.report.load import RunData
from cudal1.report.plots import _PALETTE, _figure, _svg

TOP = 6  # kernels per bar; the rest is one "other" segment
OTHER = "#bdbdbd"
COLORS = _PALETTE + ["#f9a825", "#ad1457", "#0277bd", "#558b2f", "#8e24aa", "#ff7043"]  # TOP x 2 names apart


def _programs(doc: dict[str, Any], data: RunData) -> list[tuple[str, ProgramProfile | None, ProgramProfile | None]]:
    """(task id, reference profile, best candidate's profile) for every task with either."""
    by_id = {rec.task.task_id: rec for rec in data.tasks}
    out = []
    for t in doc["tasks"]:
        rec = by_id.get(t["task"])
        if rec is None:
            continue
        results = [c.result for c in rec.candidates if c.result is not None]
        ref = None
        for r in ([rec.reference] if rec.reference else []) + results:
            if r.profile is not None and r.profile.reference.ok:
                ref = r.profile.reference
                break
        best = next((c.result for c in rec.candidates if c.hash == t.get("best_candidate") and c.result), None)
        cand = best.profile.candidate if best and best.profile and best.profile.candidate.ok else None
        if ref or cand:
            out.append((t["task"], ref, cand))
    return out


def _segments(p: ProgramProfile) -> list[tuple[str, float]]:
    segs = [(k.name, k.total_us) for k in p.kernels[:TOP]]
    rest = sum(k.total_us for k in p.kernels[TOP:])
    return segs + ([("other kernels", rest)] if rest > 0 else [])


def kernel_bars(ref: ProgramProfile | None, best: ProgramProfile | None) -> str:
    """Two horizontal bars (reference, best) of kernel time in µs, stacked by kernel, longest first."""
    rows = [(label, p) for label, p in (("best", best), ("reference", ref)) if p is not None]
    if not rows:
        return ""
    fig = _figure(7.5, 0.8 + 0.5 * len(rows))
    ax = fig.add_subplot()
    colors: dict[str, str] = {}
    for y, (_, p) in enumerate(rows):
        left = 0.0
        for name, width in _segments(p):
            color = OTHER if name == "other kernels" else colors.setdefault(name, COLORS[len(colors) % len(COLORS)])
            ax.barh(y, width, left=left, color=color, edgecolor="white", linewidth=0.6,
                    label=short(name, 48))
            left += width
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_xlabel("kernel time in one profiled call (µs)")
    handles, labels = ax.get_legend_handles_labels()
    seen: dict[str, Any] = {}
    for h, lab in zip(handles, labels):
        seen.setdefault(lab, h)
    ax.legend(list(seen.values()), list(seen), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
    ax.grid(axis="x", alpha=0.25)
    return _svg(fig, "kbar")


def roofline(points: list[tuple[str, ProgramProfile | None, ProgramProfile | None]]) -> str:
    """Each task's reference (circle) and best (triangle) at (FLOPs/byte, achieved FLOP/s), joined
    by an arrow, under the device's bandwidth and compute ceilings where the profiles know them."""
    pts = [(task, p, kind) for task, ref, best in points for p, kind in ((ref, "reference"), (best, "best"))
           if p is not None and p.intensity and p.achieved_flops]
    if not pts:
        return ""
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot()
    tasks = list(dict.fromkeys(task for task, _, _ in pts))
    color = {task: _PALETTE[i % len(_PALETTE)] for i, task in enumerate(tasks)}
    xs = [p.intensity for _, p, _ in pts]
    bw = max((p.peak_bandwidth or 0 for _, p, _ in pts), default=0)
    peak = max((p.peak_flops or 0 for _, p, _ in pts), default=0)
    ridge = [peak / bw] if bw and peak else []
    lo_x, hi_x = min(xs + ridge) / 4, max(xs + ridge) * 4
    if bw:
        xline = [lo_x, ridge[0] if ridge else hi_x]
        ax.plot(xline, [bw * x for x in xline], color="#555", lw=1.2, label=f"peak bandwidth {bw / 1e12:.3g} TB/s")
    if peak:
        ax.plot([peak / bw if bw else lo_x, hi_x], [peak, peak], color="#555", lw=1.2, ls="--",
                label=f"peak {peak / 1e12:.3g} TFLOP/s")
    for task in tasks:
        mine = {kind: p for t, p, kind in pts if t == task}
        for kind, marker in (("reference", "o"), ("best", "^")):
            if kind in mine:
                ax.scatter([mine[kind].intensity], [mine[kind].achieved_flops], marker=marker, s=36, zorder=3,
                           color=color[task], label=f"{task} {kind}")
        if len(mine) == 2:
            ax.annotate("", xy=(mine["best"].intensity, mine["best"].achieved_flops),
                        xytext=(mine["reference"].intensity, mine["reference"].achieved_flops),
                        arrowprops={"arrowstyle": "->", "color": color[task], "lw": 0.9})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo_x, hi_x)
    ax.set_xlabel("arithmetic intensity (task FLOPs per byte moved, log)")
    ax.set_ylabel("achieved FLOP/s (log)")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _si(v) + "FLOP/s"))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_formatter(NullFormatter())
    ax.grid(which="major", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _svg(fig, "roof")


def _si(v: float) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if v >= scale:
            return f"{v / scale:g} {prefix}"
    return f"{v:g} "


def profile_section(doc: dict[str, Any], data: RunData) -> dict[str, Any]:
    """What ``profiles.html.j2`` shows (see the module docstring)."""
    programs = _programs(doc, data)
    if not programs:
        return {"roofline": "", "tasks": [], "note": ""}
    anchors = {t["task"]: i for i, t in enumerate(doc["tasks"], 1)}
    tasks = [{"task": task, "anchor": anchors[task], "bars": kernel_bars(ref, best),
              "reference": headline(ref) if ref else "not profiled",
              "best": headline(best) if best else "not profiled"} for task, ref, best in programs]
    cpu = all(p is None or p.device == "cpu" for _, ref, best in programs for p in (ref, best))
    note = ("CPU profiles: operator self times, no device ceilings (peaks are unknown on the CPU)." if cpu else "")
    return {"roofline": roofline(programs), "tasks": tasks, "note": note}
