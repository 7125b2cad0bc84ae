"""Reward shaping for GRPO: a judge verdict → one float.  Pure functions, no torch, no judge.

Contract (CUDA-L1's reward is the measured speedup; its normalisation, clipping bound, window
and failure values below are cudal1's choices, not restated from the paper):

* A **success** (``ok``, task not flagged ``degenerate_task``, finite positive speedup) is
  rewarded by its speedup normalised with running statistics, ``(s - mean) / std``, clipped to
  ``[-clip, +clip]`` (``clip = k = 1.5`` by default).  The statistics are over the last ``window``
  successes (all tasks together), *including the batch being scored* (so the first batch is
  normalised by itself); ``std`` is floored at ``min_std`` so a batch of near-identical timings
  does not turn noise into ±k.  With ``log_speedup`` the statistics are of ``ln s`` instead (a
  2x→4x step then weighs like 1x→2x).
* A **failure** gets a fixed negative per cause: ``format`` (no usable code in the response),
  ``compile_error``, ``runtime_error``, ``timeout``, ``incorrect``, and the lowest of all,
  ``rejected`` (cheating: a guard fired).  Defaults put every failure below ``-clip``, so any
  verified program outranks any failing one — otherwise a slow-but-correct answer could score
  below a crash and the policy would learn that crashing is the safer bet.
* A success on a **degenerate task** (the reference output is constant or ignores its inputs:
  no speedup on it means anything) gets ``degenerate`` (default 0) and is not added to the
  statistics.
* Optionally (``analysis_bonus`` > 0; off by default, cudal1's choice, not the paper's) every
  rollout gets ``analysis_bonus x`` the score of its Performance Analysis check
  (:func:`cudal1.prompts.check_analysis`: does it quote the measured speedups the prompt showed —
  the best one's, two to compare — and tie a cause to them; boilerplate and one-shot prompts
  score 0).  Validation keeps the two orderings below with the bonus
  added: ``rejected`` stays the lowest, and every failure stays below ``-clip``.

Not covered: per-task statistics (the window is shared by all tasks), and
timing noise (``speedup_ci`` is not consulted).  Validation (:meth:`RewardConfig.__post_init__`)
guarantees ``rejected`` is strictly the lowest reward any outcome can get.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable

from cudal1.config import Config, ConfigError

# Outcome kinds besides the Status values: a response with no usable code.
FORMAT = "format"
FAILURE_KINDS = (FORMAT, "compile_error", "runtime_error", "timeout", "incorrect", "rejected")


@dataclass(frozen=True)
class RewardConfig(Config):
    """How verdicts become rewards (see the module docstring).  Field comments are the help text."""

    SECTION = "reward"

    clip: float = 1.5  # k: normalised speedups are clipped to [-k, +k] (cudal1's default)
    window: int = 1024  # running statistics over the last N successes (all tasks)
    min_std: float = 0.1  # floor on the running std (in speedup units, or log units with log_speedup)
    log_speedup: bool = False  # normalise ln(speedup) instead of speedup
    format: float = -2.0  # no usable code block in the response
    compile_error: float = -1.9  # the candidate does not import/build
    runtime_error: float = -1.8  # it crashes (or runs out of memory) while running
    timeout: float = -1.8  # it exceeds a phase's time limit
    incorrect: float = -1.6  # wrong outputs on fresh inputs
    rejected: float = -3.0  # cheating caught by a guard: must be the lowest reward
    degenerate: float = 0.0  # ok on a task whose output ignores its inputs (speedup means nothing)
    analysis_bonus: float = (
        0.0  # cudal1's format term, off by default: + bonus x the Performance Analysis check's score
    )

    def validate(self) -> None:
        if not self.clip > 0:
            raise ConfigError("reward clip must be positive")
        if self.window < 1:
            raise ConfigError("reward window must be at least 1")
        if not self.min_std > 0:
            raise ConfigError("reward min_std must be positive")
        others = [getattr(self, k) for k in FAILURE_KINDS if k != "rejected"] + [self.degenerate, -self.clip]
        if not all(math.isfinite(v) for v in others + [self.rejected]):
            raise ConfigError("rewards must be finite")
        bonus = self.analysis_bonus
        if not (math.isfinite(bonus) and bonus >= 0):
            raise ConfigError("reward analysis_bonus must be finite and >= 0")
        if not self.rejected + bonus < min(others):
            raise ConfigError(
                f"reward for rejected ({self.rejected}, plus an analysis_bonus of {bonus}) must be below every "
                f"other reward (lowest other: {min(others)}, including -clip)"
            )
        worst_fail = max(getattr(self, k) for k in FAILURE_KINDS if k != "rejected")
        if bonus and not worst_fail + bonus < -self.clip:
            raise ConfigError(
                f"reward analysis_bonus {bonus} would lift a failure ({worst_fail}) to -clip ({-self.clip}) "
                "or above: a verified program must outrank every failing one"
            )

    def failure(self, kind: str) -> float:
        """The fixed reward of a failure ``kind`` (one of :data:`FAILURE_KINDS`)."""
        if kind not in FAILURE_KINDS:
            raise KeyError(f"unknown failure kind {kind!r}; known: {', '.join(FAILURE_KINDS)}")
        return float(getattr(self, kind))


@dataclass(frozen=True)
class Outcome:
    """What the reward needs from one rollout's verdict."""

    kind: str  # "ok", or one of FAILURE_KINDS
    speedup: float | None = None  # measured speedup (ok only)
    degenerate: bool = False  # the task was flagged degenerate_task
    analysis: float = 0.0  # the Performance Analysis check's score in [0, 1] (cudal1.prompts.check_analysis)

    @property
    def success(self) -> bool:
        """Counts as a verified program with a usable speedup (enters the statistics)."""
        s = self.speedup
        return self.kind == "ok" and not self.degenerate and s is not None and math.isfinite(s) and s > 0


def outcome_of(result) -> Outcome:
    """The :class:`Outcome` of an :class:`~cudal1.types.EvalResult` (``None``: a format failure)."""
    if result is None:
        return Outcome(FORMAT)
    kind = result.status.value
    return Outcome(kind, result.speedup if kind == "ok" else None, "degenerate_task" in (result.flags or []))


class RunningStats:
    """Mean and standard deviation over the last ``window`` values pushed (population std)."""

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)

    def push(self, values: Iterable[float]) -> None:
        self.values.extend(float(v) for v in values)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else 0.0

    @property
    def std(self) -> float:
        n = len(self.values)
        if n < 2:
            return 0.0
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / n)


def _value(speedup: float, cfg: RewardConfig) -> float:
    return math.log(speedup) if cfg.log_speedup else speedup


def normalized(speedup: float, stats: RunningStats, cfg: RewardConfig) -> float:
    """``clip((value(s) - mean) / max(std, min_std), -k, k)`` against ``stats`` as they are."""
    z = (_value(speedup, cfg) - stats.mean) / max(stats.std, cfg.min_std)
    return max(-cfg.clip, min(cfg.clip, z))


def shape_rewards(outcomes: list[Outcome], stats: RunningStats, cfg: RewardConfig) -> list[float]:
    """Rewards for one batch, in order.  Pushes the batch's successes into ``stats`` first, then
    normalises each success against the updated statistics (see the module docstring)."""
    stats.push(_value(o.speedup, cfg) for o in outcomes if o.success)  # type: ignore[arg-type]
    rewards = []
    for o in outcomes:
        if o.success:
            base = normalized(o.speedup, stats, cfg)  # type: ignore[arg-type]
        elif o.kind == "ok":
            base = cfg.degenerate
        else:
            base = cfg.failure(o.kind)
        rewards.append(base + cfg.analysis_bonus * o.analysis)
    return rewards
