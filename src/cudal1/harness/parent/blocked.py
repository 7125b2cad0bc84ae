"""Timed calls that were *blocked* beside other jobs: judged again with the GPU to itself.

A timed call that waits for the device inside (a synchronize, a blocking copy, an allocation
that frees the caching allocator's blocks to retry) is not issued while the gate holds the GPU;
the gate opens without it and the call's GPU figure then holds host time (:mod:`cudal1.harness
.timer`, ``GateWait``).  Beside other jobs that is not always the program's own doing: on an
H200 two torch.compile baselines' calls were blocked on every call while a neighbour held
96 GiB of the GPU, and read 0.216x and 2.04x where the same programs judged beside lighter
neighbours read 1.49x and 3.06x, unblocked (2026-12-05).  So a verdict whose calls on one side
were mostly blocked, judged beside other jobs, is judged once more alone
(:meth:`cudal1.harness.parent.batch.Batch.judge`, flag ``rejudged_alone``); what the first
verdict saw stays in ``figures["rejudged_alone"]``.

Contract: :func:`blocked_side` names the side (``reference`` or ``candidate``) whose timed calls
were at least :data:`BLOCKED_SHARE` blocked (``figures["blocked_calls"]``), the candidate's first;
:data:`REFERENCE_BLOCKS` remembers, for the process, the tasks whose reference's calls were
blocked even alone (a reference that waits for the device by itself), so their later verdicts are
not judged again for it.  A program whose own calls block alone keeps its blocked figure.
"""

from __future__ import annotations

import threading

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


class ReferenceBlocks:
    """Task hashes whose reference's timed calls were blocked with the GPU to itself.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: set[str] = set()

    def note(self, task_hash: str) -> None:
        with self._lock:
            self._tasks.add(task_hash)

    def __contains__(self, task_hash: object) -> bool:
        with self._lock:
            return task_hash in self._tasks


REFERENCE_BLOCKS = ReferenceBlocks()


def worth_judging_alone(result: EvalResult, task_hash: str) -> str | None:
    """The side to judge again alone for, or None: a blocked side, unless it is the reference of a
    task whose reference blocks by itself."""
    side = blocked_side(result)
    if side == "reference" and task_hash in REFERENCE_BLOCKS:
        return None
    return side
