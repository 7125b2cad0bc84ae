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

Contract: :func:`blocked_sides` names the sides (``candidate``, ``reference``) whose timed calls
were at least :data:`BLOCKED_SHARE` blocked (``figures["blocked_calls"]``).
``TASK_MEMORY`` (:mod:`.gpu_memory`, kept in the cache directory across processes) remembers the
tasks whose reference's calls were blocked even alone (a reference that waits for the device by
itself), so their later verdicts whose reference's calls block are not judged again; a resumed
run's store tells a fresh machine the same (:meth:`cudal1.recorded.RecordedJudge.prime_batches`).
"""

from __future__ import annotations

from cudal1.harness.parent import gpu_memory
from cudal1.types import EvalResult, Status

BLOCKED_SHARE = 0.5  # of a side's timed calls


def blocked_sides(result: EvalResult) -> tuple[str, ...]:
    """The sides (``candidate``, ``reference``) whose timed calls were mostly blocked in an ``ok``
    verdict."""
    if result.status is not Status.OK:
        return ()
    return sides_blocked(result.figures.get("blocked_calls"))


def sides_blocked(counts: dict | None) -> tuple[str, ...]:
    """:func:`blocked_sides` of an ``ok`` verdict's ``figures["blocked_calls"]`` (a stored one's too)."""
    counts = counts or {}
    calls = counts.get("calls") or {}
    return tuple(side for side in ("candidate", "reference")
                 if (total := calls.get(side) or 0) and (counts.get(side) or 0) >= BLOCKED_SHARE * total)


def worth_judging_alone(result: EvalResult, task_hash: str) -> str | None:
    """The side to judge again alone for, or None: a blocked side (the candidate's first), unless
    the reference's calls are blocked too and its task's reference blocks by itself (both sides'
    figures then hold host time, each judged beside the same neighbours)."""
    sides = blocked_sides(result)
    if "reference" in sides and gpu_memory.TASK_MEMORY.reference_blocks(task_hash):
        return None
    return sides[0] if sides else None
