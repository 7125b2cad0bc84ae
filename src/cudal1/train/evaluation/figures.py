"""The figures of a fixed-budget evaluation: k one-shot samples per task → rates, fast_p, best-of-k
speedups and pass@k (pure; no torch, no judge).

Contract, per sample (:class:`Sample`, one judged response):

* **compiled**: the response had usable code and the judge got past importing and building it
  (status not ``format``/``compile_error``, and it reached construction: phase ``construct`` or
  later; a static-guard refusal never built anything and does not count);
* **correct**: compiled and its outputs passed the correctness trials (phase ``timing`` or later,
  status not ``incorrect``) — a cheat caught while timed still counts as correct here, not as ok;
* **ok**: the judge's verdict is ``ok`` (correct, timed, nothing refused).

Over the evaluation (``k`` = samples per task):

* ``compile_rate``, ``correct_rate``, ``ok_rate``: shares of all samples;
* ``pass@j`` for j = 1, 2, 4, ... up to k (and k itself): the unbiased estimator of Chen et al.
  (2021), ``1 - C(n-c, j) / C(n, j)`` per task with n samples of which c are ok, averaged over
  tasks;
* ``fast_p`` (p = 1.0, 1.2, 1.5, 2.0; KernelBench's fast_p with the best of k samples): the share
  of tasks with an ok sample faster than p with confidence (the 95% CI's lower bound above p,
  :func:`cudal1.speedup.clears`), degenerate tasks counting as not fast; ``fast_p_point`` the same
  by point value; ``fast_p_at_1`` the expected fast_p of one sample (each task's share of such
  samples, averaged);
* ``speedup``: ``geomean`` and ``median`` over **every** task of the best-of-k speedup, a task
  without an ok sample (or a degenerate one) counting as 1.0, the reference it leaves in place
  (``convention`` states it; ``tasks`` counted, ``unsolved`` of them at 1.0) — so solving fewer
  tasks cannot raise them; beside them, labelled, the same over the ``solved`` tasks alone
  (``solved_geomean``, ``solved_median``: cudal1's ``measured`` convention, which a model that
  answers only the tasks it is best at would inflate).  A solved task slower than the reference
  counts at its measured speedup, below 1.0.

Not covered: confidence intervals of these aggregates.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from cudal1.speedup import clears
from cudal1.tables import geomean

FAST_P = (1.0, 1.2, 1.5, 2.0)
UNSOLVED = 1.0  # the speedup of a task without an ok answer: the reference stays in place
CONVENTION = "best of k per task over all tasks; a task without an ok answer (or degenerate) counts 1.0x, the reference"
BUILT_PHASES = frozenset(
    {"construct", "compile", "compile_cpu", "correctness", "timing", "verify", "verify_timing", "done"}
)
CHECKED_PHASES = frozenset({"timing", "verify", "verify_timing", "done"})


@dataclass(frozen=True)
class Sample:
    """One judged sample of a task."""

    kind: str  # "format" (no usable code) or the judge's status
    phase: str = ""  # the last phase the judge reached
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    degenerate: bool = False  # the task was flagged degenerate_task

    @classmethod
    def of(cls, result: Any) -> "Sample":
        """From an :class:`~cudal1.types.EvalResult` (``None``: a response without code)."""
        if result is None:
            return cls("format")
        ci = tuple(result.speedup_ci) if result.speedup_ci else None
        return cls(result.status.value, result.phase or "", result.speedup, ci,  # type: ignore[arg-type]
                   "degenerate_task" in (result.flags or []))

    @property
    def compiled(self) -> bool:
        return self.kind not in ("format", "compile_error") and (self.kind == "ok" or self.phase in BUILT_PHASES)

    @property
    def correct(self) -> bool:
        return self.kind == "ok" or (self.compiled and self.kind != "incorrect" and self.phase in CHECKED_PHASES)

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    def faster(self, p: float, point: bool = False) -> bool:
        """ok, on a task that is not degenerate, and faster than ``p`` (with confidence unless ``point``)."""
        if not self.ok or self.degenerate or self.speedup is None:
            return False
        return self.speedup > p if point else clears(self.speedup, self.speedup_ci, p)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` samples of which ``c`` pass: ``1 - C(n-c, k)/C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(k: int) -> list[int]:
    """1, 2, 4, ... below ``k``, then ``k``."""
    out, j = [], 1
    while j < k:
        out.append(j)
        j *= 2
    return out + [k]


def _key(p: float) -> str:
    return f"{p:.1f}"


def figures(samples: dict[str, list[Sample]], k: int) -> dict[str, Any]:
    """The evaluation's figures from each task's samples (see the module docstring).  A task with
    fewer than ``k`` samples (failed requests) is scored on what it has; ``complete`` says whether
    every task has ``k``."""
    flat = [s for ss in samples.values() for s in ss]
    n_samples = len(flat)
    rate = (lambda f: sum(map(f, flat)) / n_samples) if n_samples else (lambda f: None)
    scored = {t: ss for t, ss in samples.items() if ss}
    passes = {}
    for j in pass_ks(k):
        vals = [pass_at_k(len(ss), sum(s.ok for s in ss), j) for ss in scored.values() if len(ss) >= j]
        passes[f"pass@{j}"] = statistics.fmean(vals) if vals else None
    tasks = len(samples)
    best: dict[str, float] = {}
    for t, ss in samples.items():
        speeds = [s.speedup for s in ss if s.ok and not s.degenerate and s.speedup is not None]
        if speeds:
            best[t] = max(speeds)

    def share(pred) -> float | None:
        return sum(1 for ss in samples.values() if pred(ss)) / tasks if tasks else None

    fast = {_key(p): share(lambda ss, p=p: any(s.faster(p) for s in ss)) for p in FAST_P}
    fast_point = {_key(p): share(lambda ss, p=p: any(s.faster(p, point=True) for s in ss)) for p in FAST_P}
    fast_one = {_key(p): (statistics.fmean(sum(s.faster(p) for s in ss) / len(ss) for ss in scored.values())
                          if scored else None) for p in FAST_P}
    values = list(best.values())
    every = [best.get(t, UNSOLVED) for t in samples]
    return {
        "tasks": tasks,
        "samples_per_task": k,
        "samples": n_samples,
        "complete": all(len(ss) >= k for ss in samples.values()),
        "compile_rate": rate(lambda s: s.compiled),
        "correct_rate": rate(lambda s: s.correct),
        "ok_rate": rate(lambda s: s.ok),
        **passes,
        "fast_p": fast,
        "fast_p_point": fast_point,
        "fast_p_at_1": fast_one,
        "speedup": {
            "geomean": geomean(every), "median": statistics.median(every) if every else None, "tasks": tasks,
            "unsolved": tasks - len(values), "convention": CONVENTION, "solved": len(values),
            "solved_geomean": geomean(values),
            "solved_median": statistics.median(values) if values else None,
        },
        "degenerate": sum(1 for ss in samples.values() if any(s.degenerate for s in ss)),
        "per_task": {
            t: {
                "samples": len(ss), "compiled": sum(s.compiled for s in ss),
                "correct": sum(s.correct for s in ss), "ok": sum(s.ok for s in ss),
                "best_speedup": best.get(t),
            }
            for t, ss in samples.items()
        },
    }


__all__ = ["CONVENTION", "FAST_P", "UNSOLVED", "Sample", "figures", "pass_at_k", "pass_ks"]
