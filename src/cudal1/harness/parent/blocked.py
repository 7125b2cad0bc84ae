"""Timed calls that were *blocked* beside other jobs: judged again with the GPU to itself.

A timed call that waits for the device inside (a synchronize, a blocking copy, an ``.item()``)
is not issued while the gate holds the GPU; the gate opens without it and the call's GPU figure
then holds host time (:mod:`cudal1.harness.timer`, ``GateWait``), which other jobs' work on the
host lengthens: a max-autotune baseline whose every call blocked read 0.88x beside three other
jobs and 2.26x judged again alone (H200, 2026-12-05).  So a verdict whose calls on one side were
mostly blocked, judged beside other jobs, is judged once more alone
(``judge`` in :mod:`cudal1.harness.parent.batch`, flag ``rejudged_alone``); what the first verdict
saw stays in ``figures["rejudged_alone"]``.  A program whose calls block alone keeps that figure:
it is the program's own.

Contract: :func:`blocked_side` names the side (``reference`` or ``candidate``) whose timed calls
were at least :data:`BLOCKED_SHARE` blocked (``figures["blocked_calls"]``), the candidate's first.
``TASK_MEMORY`` (:mod:`.gpu_memory`, kept in the cache directory across processes) remembers the
tasks whose reference's calls were blocked even alone (a reference that waits for the device by
itself), so their later verdicts are not judged again for it.
"""

from __future__ import annotations

from cudal1.harness.parent import gpu_memory
from cudal1.types import EvalResult, Status

BLOCKED_SHARE = 0.5  # of a side's timed calls


def blocked_side(result: EvalResult) -> str | None:
    """The side whose timed calls were mostly blocked in an ``ok`` verdict, else None."""
    if result.status is not Status.OK:
        return None
    counts = result.figures.get("blocked_calls") or {}
    calls = counts.get("calls") or {}
    for side in ("candidate", "reference"):
        n, total = counts.get(side) or 0, calls.get(side) or 0
        if total and n >= BLOCKED_SHARE * total:
            return side
    return None


def worth_judging_alone(result: EvalResult, task_hash: str) -> str | None:
    """The side to judge again alone for, or None: a blocked side, unless it is the reference of a
    task whose reference blocks by itself."""
    side = blocked_side(result)
    if side == "reference" and gpu_memory.TASK_MEMORY.reference_blocks(task_hash):
        return None
    return side
