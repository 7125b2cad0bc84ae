"""Reading a measured speedup as what it is: a figure with noise.

Contract (one rule for the optimizer's summary, ``best/``, the CLI tables and the report):

* A verdict is **faster** than a threshold ``p`` only when it is ``ok``, its timing is trusted
  (not ``contended``) and its speedup's 95% confidence interval lies above ``p`` (lower bound >
  ``p``; on the CPU clock above ``p`` × (1 + :data:`CPU_MARGIN`)); **slower** only when its
  interval lies below ``p`` (on the CPU clock below ``p`` × (1 − :data:`CPU_SLOWER_MARGIN`)).  On
  the CPU clock either claim also needs the two sides' median calls :data:`CPU_CALL_FLOOR_MS`
  apart.  A
  speedup without an interval (published release files, records from before intervals were
  kept) is read as its point value.
* A result is **uncertain** when its interval includes 1.0 (not measurably faster or slower than
  the reference), and **noisy** when the judge flagged ``high_variance`` (timing IQR above 10% of
  the median).  Tables mark both (:func:`cell`, :data:`LEGEND`); neither changes a verdict.
* The point value still ranks candidates (the best is the highest measured speedup); ``best/``
  only takes a candidate whose point value is above 1.0, so it never holds one measured slower
  than the reference.

Pure functions of the verdict's fields; no torch.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from cudal1.tables import fmt

UNCERTAIN_MARK = "?"
NOISY_MARK = "*"
LEGEND = (f"{UNCERTAIN_MARK}: the 95% CI includes 1.0 (not measurably faster or slower); "
          f"{NOISY_MARK}: high timing variance (IQR above 10% of the median)")


def clears(speedup: float | None, ci: Sequence[float] | None, threshold: float = 1.0) -> bool:
    """Whether a speedup is above ``threshold`` with confidence: the CI's lower bound is, or,
    without a CI, the point value is."""
    if speedup is None or not math.isfinite(speedup):
        return False
    low = ci[0] if ci else speedup
    return low is not None and low > threshold


def _ok(result: Any) -> bool:
    return getattr(result.status, "value", result.status) == "ok" and result.speedup is not None


# On the CPU clock an identical program reads slower in the candidate's process than in the
# reference worker: medians of 0.85-0.93x on a quiet 2-core VM with torch's two threads, 0.96-0.97x
# with one (2026-12-02; docs/harness.md, "Known limits"), single verdicts as low as 0.78x with the
# top of their CI at 0.86.  A CPU verdict claims faster only beyond CPU_MARGIN above the threshold,
# and, since the bias runs against the candidate, slower only beyond the wider CPU_SLOWER_MARGIN
# below it.
CPU_MARGIN = 0.15
CPU_SLOWER_MARGIN = 0.20
# The bias also holds a fixed cost per call, which no relative margin covers on a short call: an
# identical 20 us program read 0.66-0.69x (its calls 0.011-0.019 ms longer in the candidate's
# process, the same with 100 operations per call), a 1 ms one 0.94x (0.076 ms), a 70 ms one 1.00x
# (2026-12-03, 2-core VM, quiet).  A CPU verdict claims neither faster nor slower unless the two
# sides' median calls also differ by more than this.  The judge's interval covers the same cost on
# its upper side (cudal1.harness.parent.stats.CPU_PROTOCOL_MS is this constant).
CPU_CALL_FLOOR_MS = 0.1


def _cpu(result: Any) -> bool:
    return "cpu_timing" in (getattr(result, "flags", None) or [])


def _margin(result: Any, cpu_margin: float) -> float:
    """``cpu_margin`` for a verdict timed on the CPU clock, else 0."""
    return cpu_margin if _cpu(result) else 0.0


def _apart(result: Any) -> bool:
    """Off the CPU clock, True; on it, whether the median calls differ by more than
    :data:`CPU_CALL_FLOOR_MS` (True when a side's timing is not on the verdict)."""
    if not _cpu(result):
        return True
    ref, cand = getattr(result, "reference", None), getattr(result, "candidate", None)
    ref_ms, cand_ms = getattr(ref, "median_ms", None), getattr(cand, "median_ms", None)
    if ref_ms is None or cand_ms is None:
        return True
    return abs(ref_ms - cand_ms) > CPU_CALL_FLOOR_MS


def faster(result: Any, threshold: float = 1.0) -> bool:
    """An ``ok`` verdict (an :class:`~cudal1.types.EvalResult`) faster than ``threshold`` with
    confidence (beyond :data:`CPU_MARGIN` on the CPU clock); never one whose timing the judge did
    not trust (``contended``: the GPU or the host was shared)."""
    return (_ok(result) and "contended" not in (result.flags or []) and _apart(result)
            and clears(result.speedup, result.speedup_ci, threshold * (1 + _margin(result, CPU_MARGIN))))


def slower(result: Any, threshold: float = 1.0) -> bool:
    """An ``ok`` verdict slower than ``threshold`` with confidence (the CI's upper bound is below
    it; beyond :data:`CPU_SLOWER_MARGIN` on the CPU clock); never a ``contended`` one."""
    return (_ok(result) and "contended" not in (result.flags or []) and bool(result.speedup_ci) and _apart(result)
            and result.speedup_ci[1] < threshold * (1 - _margin(result, CPU_SLOWER_MARGIN)))


def uncertain(speedup: float | None, ci: Sequence[float] | None) -> bool:
    """The CI includes 1.0: the candidate is not measurably faster or slower than the reference."""
    return speedup is not None and bool(ci) and ci[0] <= 1.0 <= ci[1]  # type: ignore[index]


def noisy(result: Any) -> bool:
    """The judge flagged the timing as high-variance."""
    return "high_variance" in (result.flags or [])


def cell(speedup: float | None, ci: Sequence[float] | None = None, high_variance: bool = False, digits: int = 3) -> str:
    """A table cell: ``2.13x``, with :data:`UNCERTAIN_MARK` when the CI includes 1.0 and
    :data:`NOISY_MARK` when the timing was high-variance; ``-`` without a speedup."""
    if speedup is None:
        return "-"
    text = fmt(float(speedup), digits=digits) + "x"
    return text + (UNCERTAIN_MARK if uncertain(speedup, ci) else "") + (NOISY_MARK if high_variance else "")


def result_cell(result: Any) -> str:
    """:func:`cell` of an ``EvalResult``'s speedup (``-`` when it has none)."""
    return cell(result.speedup, result.speedup_ci, noisy(result))
