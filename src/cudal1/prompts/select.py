"""Exemplar selection: which earlier candidates of a task a contrastive prompt shows.

Contract: pure functions of the pool, the arguments and the ``random.Random`` passed in (the same
seed gives the same selection).  Only *eligible* exemplars are ever selected: ``status == "ok"``
with a finite, positive speedup — never a failed, ``rejected`` or unmeasured candidate.  The pool
is taken in chronological order (oldest first, as the run store returns it); exemplars with the
same code are one candidate (the latest measurement counts).  Selections come back sorted by
speedup ascending, the order :func:`cudal1.prompts.compose.build_prompt` shows them in.

Strategies (registry :data:`STRATEGIES`; an unknown name raises ``KeyError`` naming the known ones):

``contrastive`` (CUDA-L1)
    Eligible candidates are grouped into speedup buckets; ``n`` *distinct* buckets are drawn
    without replacement, each draw with probability softmax((bucket mean − global mean) / τ) over
    the buckets not yet drawn; then one candidate is drawn uniformly from each chosen bucket.
    With fewer eligible buckets than ``n`` every bucket is taken.

    Buckets have a fixed width in log-speedup: bucket ``k`` holds speedups ``s`` with
    ``floor(ln(s) / bucket_width) == k`` (default width ``ln 1.1``: each bucket spans a factor of
    1.1).  Why log and fixed width rather than quantiles: speedups are ratios, so 1.0→1.1 and
    2.0→2.2 are the same step; a fixed grid keeps a candidate's bucket stable as the pool grows
    (quantile edges move with every new candidate); and distinct buckets then guarantee that the
    exemplars differ by a real margin (~10%, above typical timing noise) — the contrast the model
    is asked to explain.  Means (bucket and global, the latter over candidates) are of
    log-speedups too, so one 100x outlier does not flatten every other bucket's weight; τ is
    therefore in log units (τ = 1: a bucket e-times faster on average is e-times as likely).
    Subtracting the global mean does not change softmax probabilities; it is kept to match the
    paper's formula, and the maximum is subtracted as well for numerical safety.

``random``
    ``n`` distinct eligible candidates, uniformly (ablation: no preference for fast ones).

``best``
    The ``n`` fastest eligible candidates (ablation: no diversity; ties go to the later one).

Not covered: cross-task exemplars, deduplication of near-identical code, and the timing
uncertainty of each speedup (``speedup_ci`` is not consulted).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any, Callable

from cudal1.prompts.compose import DEFAULT_TEMPLATE, build_prompt
from cudal1.types import Exemplar, Prompt, Task

DEFAULT_BUCKET_WIDTH = math.log(1.1)

# Statuses that count as a failure worth feeding back.  ``rejected`` is left out on purpose: its
# code is a cheat, and showing it (even labelled) puts the pattern in the model's context.
FEEDBACK_STATUSES = ("compile_error", "runtime_error", "incorrect", "timeout")


def eligible(pool: list[Exemplar]) -> list[Exemplar]:
    """The selectable exemplars of ``pool``: ``ok`` with a finite positive speedup, one per code
    text (the latest), in pool order."""
    latest: dict[str, int] = {}
    for i, e in enumerate(pool):
        s = e.speedup
        if e.status == "ok" and s is not None and math.isfinite(s) and s > 0:
            latest[e.code] = i
    return [pool[i] for i in sorted(latest.values())]


def bucket_index(speedup: float, bucket_width: float = DEFAULT_BUCKET_WIDTH) -> int:
    """The log-speedup bucket of ``speedup`` (bucket 0 is [1, e^width))."""
    return math.floor(math.log(speedup) / bucket_width)


def speedup_buckets(
    candidates: list[Exemplar], bucket_width: float = DEFAULT_BUCKET_WIDTH
) -> dict[int, list[Exemplar]]:
    """Eligible ``candidates`` grouped by :func:`bucket_index`, buckets in ascending order."""
    buckets: dict[int, list[Exemplar]] = {}
    for e in candidates:
        buckets.setdefault(bucket_index(e.speedup, bucket_width), []).append(e)  # type: ignore[arg-type]
    return dict(sorted(buckets.items()))


def bucket_probabilities(
    buckets: dict[int, list[Exemplar]], tau: float = 1.0
) -> dict[int, float]:
    """First-draw probabilities softmax((mean log-speedup of bucket − global mean) / τ)."""
    all_logs = [math.log(e.speedup) for members in buckets.values() for e in members]  # type: ignore[arg-type]
    if not all_logs:
        return {}
    global_mean = sum(all_logs) / len(all_logs)
    scores = {
        k: (sum(math.log(e.speedup) for e in m) / len(m) - global_mean) / tau  # type: ignore[arg-type]
        for k, m in buckets.items()
    }
    top = max(scores.values())
    weights = {k: math.exp(v - top) for k, v in scores.items()}
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}


def _weighted_draw(weights: dict[int, float], rng: random.Random) -> int:
    keys = list(weights)
    x = rng.random() * sum(weights.values())
    acc = 0.0
    for k in keys:
        acc += weights[k]
        if x < acc:
            return k
    return keys[-1]  # rounding at the top end


def _contrastive(cands: list[Exemplar], n: int, rng: random.Random, tau: float, width: float) -> list[Exemplar]:
    buckets = speedup_buckets(cands, width)
    if len(buckets) <= n:
        chosen = list(buckets)
    else:
        probs = bucket_probabilities(buckets, tau)
        chosen = []
        for _ in range(n):  # without replacement: renormalise over the buckets left
            k = _weighted_draw(probs, rng)
            chosen.append(k)
            del probs[k]
    return [rng.choice(buckets[k]) for k in chosen]


def _random(cands: list[Exemplar], n: int, rng: random.Random, tau: float, width: float) -> list[Exemplar]:
    return rng.sample(cands, min(n, len(cands)))


def _best(cands: list[Exemplar], n: int, rng: random.Random, tau: float, width: float) -> list[Exemplar]:
    order = sorted(range(len(cands)), key=lambda i: (cands[i].speedup, i), reverse=True)
    return [cands[i] for i in order[:n]]


Strategy = Callable[[list[Exemplar], int, random.Random, float, float], list[Exemplar]]
STRATEGIES: dict[str, Strategy] = {"contrastive": _contrastive, "random": _random, "best": _best}


def select_exemplars(
    pool: list[Exemplar],
    n: int,
    strategy: str = "contrastive",
    *,
    rng: random.Random,
    tau: float = 1.0,
    bucket_width: float = DEFAULT_BUCKET_WIDTH,
) -> list[Exemplar]:
    """Up to ``n`` distinct eligible exemplars from ``pool`` by ``strategy`` (see module
    docstring), sorted by speedup ascending.  Fewer come back when fewer are eligible (or, for
    ``contrastive``, when there are fewer buckets than ``n``)."""
    if strategy not in STRATEGIES:
        raise KeyError(f"unknown exemplar strategy {strategy!r}; known strategies: {', '.join(STRATEGIES)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if not bucket_width > 0:
        raise ValueError(f"bucket_width must be > 0, got {bucket_width}")
    cands = eligible(pool)
    if n == 0 or not cands:
        return []
    picked = STRATEGIES[strategy](cands, n, rng, tau, bucket_width)
    return sorted(picked, key=lambda e: e.speedup)  # type: ignore[arg-type, return-value]


def failed_feedback(
    pool: list[Exemplar],
    k: int,
    rng: random.Random,
    *,
    window: int | None = None,
    statuses: tuple[str, ...] = FEEDBACK_STATUSES,
) -> list[Exemplar]:
    """Up to ``k`` recent failed exemplars to show with their feedback, in pool order.

    Candidates are the failures among the last ``window`` distinct failed codes of ``pool`` (pool
    order = chronological; default window ``2 * k``), with ``status`` in ``statuses`` (by default
    every failure except ``rejected``, whose code is a cheat).  ``k`` of them are drawn uniformly
    without replacement, so successive prompts do not all repeat the single latest error while
    old, probably-fixed errors stay out.
    """
    if k <= 0:
        return []
    window = 2 * k if window is None else window
    latest: dict[str, int] = {}
    for i, e in enumerate(pool):
        if e.status in statuses:
            latest[e.code] = i
    recent = sorted(latest.values())[-window:] if window > 0 else []
    picked = sorted(rng.sample(recent, min(k, len(recent))))
    return [pool[i] for i in picked]


def contrastive_prompt(task: Task, ok: list[Exemplar], failed: list[Exemplar], hardware: str, *, exemplars: int,
                       strategy: str, tau: float, feedback: bool, rng: random.Random,
                       template: str = DEFAULT_TEMPLATE, profiles: Mapping[str, Any] | None = None) -> Prompt:
    """The contrastive prompt of ``task`` from its pool (``ok``: measured candidates, ``failed``:
    failed ones with the judge's feedback), as the optimizer and GRPO both build it: ``exemplars``
    measured programs drawn by ``strategy`` (softmax temperature ``tau`` over speedup buckets),
    and with ``feedback`` one recent failure and why it failed (:func:`failed_feedback`); with
    ``profiles`` (candidate hash or ``"reference"`` -> profile), the measured section."""
    shown = select_exemplars(ok, exemplars, strategy, rng=rng, tau=tau)
    if feedback and failed:
        shown = list(failed_feedback(failed, 1, rng)) + list(shown)
    return build_prompt(task, shown, hardware, feedback=feedback, template=template, profiles=profiles)
