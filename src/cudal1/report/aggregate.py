"""Aggregate figures over judged tasks: pure functions, no I/O, no torch.

Contract
--------
* Input is one :class:`TaskOutcome` per task: the best verified (``ok``) speedup over eager
  (``None`` when no candidate was verified), whether the judge found the task degenerate, and the
  measured baselines' own speedups over eager.
* **Degenerate tasks are reported apart**: they are left out of every figure below (``tasks``
  counts attempted, non-degenerate tasks) and counted in ``degenerate``.  Rejected candidates
  never reach these figures at all (only ``ok`` verdicts make a best speedup); their counts are
  reported with the status and flag counts (:func:`verdict_counts`).
* **fast_p**: the share of *all* attempted tasks whose best verified speedup is greater than
  ``p`` *with confidence*: the lower bound of its 95% CI is above ``p`` (a speedup recorded
  without a CI counts by its value; see :mod:`cudal1.speedup`).  **fast_p_point** is
  KernelBench's definition, the same share by the point value alone (strictly greater than
  ``p``), so the tasks counted faster only by noise are visible as the difference.  Both hold
  whatever the convention; ``fast_0`` is the share of tasks with at least one verified
  candidate.  Keys are the strings "0", "1.0", "1.2", "1.5", "2.0".  ``faster`` and
  ``faster_point`` count tasks above the convention's threshold (1.0 for ``measured``) the
  same two ways.
* The speedup statistics (mean, median, geometric mean, max, 25th/75th percentile by linear
  interpolation) depend on an explicit :class:`Conventions` value:

  - ``all-tasks`` (default): every attempted task, its best verified speedup as measured (a best
    below 1.0 stays below 1.0), a task without one at 1.0 (the reference it leaves in place) — so
    solving fewer tasks cannot raise the figures;
  - ``measured`` (solved tasks only): the best verified speedup of each task that has one, as
    measured; tasks without a verified candidate are left out (shown beside, labelled).
  - ``cuda-l1`` (CUDA-L1's paper): a task counts its best speedup only when it is greater than
    1.01x; every other task (slower, barely faster, or nothing verified) counts as 1.0x, since the
    user keeps the reference.

* Against a baseline (``torch.compile``, CUDA graphs, ...) a task's figure is its best speedup
  over eager divided by the baseline's speedup over eager, on the tasks where that baseline was
  measured; the same convention is applied to that ratio.

Not covered: confidence intervals of aggregates (each verdict carries its own CI), weighting by
task cost.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

FAST_P: tuple[float, ...] = (0.0, 1.0, 1.2, 1.5, 2.0)


@dataclass(frozen=True)
class Conventions:
    """How a task's best speedup enters the speedup statistics (not fast_p)."""

    name: str
    missing: float | None  # value of a task without a counted speedup; None: leave the task out
    threshold: float | None  # a best speedup counts only when strictly greater; None: any verified one

    def value(self, best: float | None) -> float | None:
        """The figure of one task under these conventions (None: not counted)."""
        if best is not None and best > 0 and (self.threshold is None or best > self.threshold):
            return best
        return self.missing


CONVENTIONS: dict[str, Conventions] = {
    "all-tasks": Conventions("all-tasks", missing=1.0, threshold=None),
    "measured": Conventions("measured", missing=None, threshold=None),
    "cuda-l1": Conventions("cuda-l1", missing=1.0, threshold=1.01),
}


def conventions(name: str) -> Conventions:
    """The registered convention ``name``; ``KeyError`` naming the known ones otherwise."""
    if name not in CONVENTIONS:
        raise KeyError(f"unknown conventions {name!r}; known: {', '.join(CONVENTIONS)}")
    return CONVENTIONS[name]


@dataclass
class TaskOutcome:
    """What the metrics need of one task."""

    task: str  # task id, e.g. "level1/19" or a file stem
    level: int | None = None
    best: float | None = None  # best verified speedup over eager (None: nothing verified)
    low: float | None = None  # lower bound of the best's 95% CI (None: no CI; the best itself counts)
    degenerate: bool = False  # the judge's degenerate-task probe fired: reported apart
    baselines: dict[str, float] = field(default_factory=dict)  # mode -> baseline's speedup over eager


# ---- elementary statistics ----------------------------------------------------------------------

from cudal1.tables import geomean  # noqa: E402 - one geomean for every figure (re-exported)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-quantile (0 <= q <= 1) by linear interpolation between closest ranks
    (numpy's default): position ``q * (n - 1)`` in the sorted values."""
    s = sorted(values)
    if not s:
        return None
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def fast_p_key(p: float) -> str:
    """The JSON key of fast_p: "0" for p = 0, else one decimal ("1.0", "1.2", ...)."""
    return "0" if p == 0 else f"{p:.1f}"


def fast_p(bests: list[float | None], p: float) -> float | None:
    """KernelBench's fast_p: share of all tasks (one entry each, None = nothing verified) whose
    best verified speedup is strictly greater than ``p``.  None when there are no tasks."""
    if not bests:
        return None
    return sum(1 for b in bests if b is not None and b > p) / len(bests)


def describe(values: list[float]) -> dict[str, float | None]:
    """mean, median, geomean, max, p25, p75 of ``values`` (all None when empty)."""
    if not values:
        return dict.fromkeys(("mean", "median", "geomean", "max", "p25", "p75"))
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "geomean": geomean(values),
            "max": max(values), "p25": percentile(values, 0.25), "p75": percentile(values, 0.75)}


# ---- aggregates --------------------------------------------------------------------------------


def summarize(bests: list[float | None], conv: Conventions = CONVENTIONS["all-tasks"],
              lows: list[float | None] | None = None) -> dict[str, Any]:
    """Figures over one group of non-degenerate tasks, given each task's best verified speedup
    and the lower bound of its 95% CI (``lows``, same order; None entries or no list: the best
    itself counts)."""
    lows = [b if low is None else low for b, low in zip(bests, lows)] if lows is not None else list(bests)
    values = [v for v in (conv.value(b) for b in bests) if v is not None]
    out: dict[str, Any] = {"tasks": len(bests), "ok": sum(1 for b in bests if b is not None), "n": len(values)}
    out.update(describe(values))
    out["fast_p"] = {fast_p_key(p): fast_p(lows, p) for p in FAST_P}
    out["fast_p_point"] = {fast_p_key(p): fast_p(bests, p) for p in FAST_P}
    threshold = conv.threshold or 1.0
    out["faster"] = sum(1 for b, low in zip(bests, lows) if b is not None and low is not None and low > threshold)
    out["faster_point"] = sum(1 for b in bests if b is not None and b > threshold)
    return out


def level_key(level: int | None) -> str:
    return f"level{level}" if level is not None else "other"


def aggregate(outcomes: list[TaskOutcome], conv: Conventions = CONVENTIONS["all-tasks"]) -> dict[str, Any]:
    """Overall, per-level and per-baseline figures; degenerate tasks listed apart."""
    live = [o for o in outcomes if not o.degenerate]
    levels: dict[str, list[TaskOutcome]] = {}
    for o in sorted(live, key=lambda o: (o.level is None, o.level or 0)):
        levels.setdefault(level_key(o.level), []).append(o)
    modes = sorted({m for o in live for m in o.baselines})
    return {
        "conventions": conv.name,
        "summary": summarize([o.best for o in live], conv, [o.low for o in live])
        | {"degenerate": len(outcomes) - len(live)},
        "levels": {k: summarize([o.best for o in group], conv, [o.low for o in group]) for k, group in levels.items()},
        "baselines": {m: against_baseline(live, m, conv) for m in modes},
        "degenerate": [o.task for o in outcomes if o.degenerate],
    }


def against_baseline(outcomes: list[TaskOutcome], mode: str, conv: Conventions) -> dict[str, Any]:
    """Best verified speedup over baseline ``mode`` on the tasks where the baseline was measured,
    and the baseline's own figures over eager on those tasks.  The ratio of two measurements has
    no CI here: its fast_p counts point values."""
    have = [o for o in outcomes if o.baselines.get(mode) and o.baselines[mode] > 0]
    ratios = [o.best / o.baselines[mode] if o.best is not None else None for o in have]
    return summarize(ratios, conv) | {"baseline_over_eager": describe([o.baselines[mode] for o in have])}


def verdict_counts(results: Iterable[Any]) -> dict[str, dict[str, int]]:
    """Counts of each status value and each flag over verdicts (objects with ``status`` and
    ``flags``; ``status`` may be a :class:`~cudal1.types.Status` or its string value)."""
    statuses: Counter = Counter()
    flags: Counter = Counter()
    for r in results:
        statuses[getattr(r.status, "value", r.status)] += 1
        flags.update(r.flags)
    return {"statuses": dict(statuses.most_common()), "flags": dict(flags.most_common())}
