"""Noticing a GRPO run that collapsed into answers without code (pure; no torch, no TRL).

A policy can drift into answers the judge cannot use — no code block, or one cut off by the
completion limit — and stay there: every rollout of a group then gets the same format reward, the
group's advantages are zero, and nothing but the KL term pulls the policy back.  The GRPO smoke did
this in one of two runs at one setting, and a lab's run can do it the same way.

Contract: :class:`CollapseWatch` is fed each logged step's outcome counts (every rank's rollouts
together, as ``metrics.jsonl``'s ``judged``).  A step is *collapsed* when the share of format
failures among its rollouts is at least ``share``; ``steps`` collapsed steps in a row are a
**collapse**, reported once (:meth:`~CollapseWatch.update` returns it) with the step its streak
began at.  A later step below ``share`` marks it recovered (``recovered_at``); a new streak after
that is reported again.  :attr:`~CollapseWatch.reported` holds every collapse, each in its latest
state (what the run's summary lists).

Not covered: collapses into other failure kinds (all compile errors, say), and slow declines that
never cross ``share``: those show in ``success_rate`` and ``reward_mean``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

FORMAT = "format"


@dataclass(frozen=True)
class Collapse:
    """A streak of steps whose rollouts were nearly all format failures."""

    began_at: int  # the first step of the streak
    detected_at: int  # the step that made it ``steps`` long
    share: float  # format failures / rollouts over the streak so far
    rollouts: int  # rollouts over the streak so far
    recovered_at: int | None = None  # the first later step below the threshold, if any
    kind: str = FORMAT

    @property
    def status(self) -> str:
        return "ongoing" if self.recovered_at is None else f"recovered at step {self.recovered_at}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"status": self.status}

    def message(self) -> str:
        """One line for a log or a summary."""
        return (f"collapse into answers without usable code from step {self.began_at} "
                f"({self.share:.0%} of {self.rollouts} rollouts since then were format failures; {self.status})")


class CollapseWatch:
    """Streaks of collapsed steps (see the module docstring).  ``steps`` 0 turns it off."""

    def __init__(self, share: float = 0.9, steps: int = 3) -> None:
        if not 0 < share <= 1 or steps < 0:
            raise ValueError(f"collapse watch needs 0 < share <= 1 and steps >= 0 (got {share}, {steps})")
        self.share, self.steps = share, steps
        self.reported: list[Collapse] = []  # every collapse so far, oldest first, each in its latest state
        self._streak: list[tuple[int, int, int]] = []  # (step, format failures, rollouts) of the running streak

    @property
    def current(self) -> Collapse | None:
        """The reported collapse still running (None when there is none)."""
        last = self.reported[-1] if self.reported else None
        return last if last is not None and last.recovered_at is None else None

    def update(self, step: int, judged: dict[str, int]) -> Collapse | None:
        """Feed one step's outcome counts; returns the collapse it reveals (only on the step it is detected)."""
        total = sum(judged.values())
        if not self.steps or total == 0:
            return None
        bad = judged.get(FORMAT, 0)
        if bad / total < self.share:
            if self.current is not None:
                self.reported[-1] = replace(self.current, recovered_at=step)
            self._streak = []
            return None
        self._streak.append((step, bad, total))
        n_bad, n_all = sum(b for _, b, _ in self._streak), sum(t for _, _, t in self._streak)
        state = Collapse(self._streak[0][0], step, n_bad / n_all, n_all)
        if self.current is not None:  # an ongoing, already reported streak: keep its figures current
            self.reported[-1] = replace(state, detected_at=self.current.detected_at)
            return None
        if len(self._streak) < self.steps:
            return None
        self.reported.append(state)
        return state


__all__ = ["Collapse", "CollapseWatch"]
