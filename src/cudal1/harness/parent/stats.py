"""The parent's statistics on a job's figures: the speedup, its 95% confidence interval, and how
much the host was shared while the blocks ran.

Contract: the speedup is ``median(reference) / median(candidate)`` of the chosen figure
(:mod:`cudal1.harness.figures`); its 95% confidence interval follows the paired design
(:func:`speedup_ci`): from the rounds' ratios, never narrower than a percentile bootstrap that
resamples both sample sets independently; on the CPU clock its upper bound also covers the
protocol's fixed cost per call in the candidate's process (:func:`cpu_protocol_ci`).
:func:`host_contention` reads how much the host was shared while the blocks ran.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cudal1.harness.figures import median
from cudal1.speedup import CPU_CALL_FLOOR_MS


def bootstrap_speedup_ci(
    ref_ms: list[float], cand_ms: list[float], samples: int = 1000, seed: int = 0
) -> tuple[float, float] | None:
    """95% percentile-bootstrap CI of median(ref)/median(cand); None with fewer than 2 samples."""
    if len(ref_ms) < 2 or len(cand_ms) < 2 or samples < 10:
        return None
    rng = np.random.default_rng(seed)
    r = np.asarray(ref_ms, dtype=np.float64)
    c = np.asarray(cand_ms, dtype=np.float64)
    ri = rng.integers(0, len(r), size=(samples, len(r)))
    ci = rng.integers(0, len(c), size=(samples, len(c)))
    ratios = np.median(r[ri], axis=1) / np.maximum(np.median(c[ci], axis=1), 1e-12)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


# Student's t, 97.5th percentile, for 1..30 degrees of freedom (above: the normal's 1.96 is close enough)
_T975 = (12.71, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
MIN_ROUNDS = 4  # rounds below which the per-round interval is not used (t grows too fast: 12.7 for two)


def rounds(blocks: list[list[Any]]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The timing blocks paired into rounds (one reference and one candidate block each, in either
    order): per round the (start, end) of its calls in each side's samples."""
    out: list[tuple[tuple[int, int], tuple[int, int]]] = []
    at = {"ref": 0, "cand": 0}
    pending: dict[str, tuple[int, int]] = {}
    for block in blocks:
        who, n = str(block[0]), int(block[1])
        if who not in at:
            continue
        pending[who] = (at[who], at[who] + n)
        at[who] += n
        if len(pending) == 2:
            out.append((pending.pop("ref"), pending.pop("cand")))
    return out


def speedup_ci(ref_ms: list[float], cand_ms: list[float], blocks: list[list[Any]], samples: int = 1000,
               seed: int = 0) -> tuple[float, float] | None:
    """95% CI of the speedup that follows the timing design: both sides are timed in alternating
    blocks, so a round's two blocks share the host's and the device's state, and what moves
    between rounds (load arriving, clocks) moves the speedup.  With at least :data:`MIN_ROUNDS`
    rounds: a t-interval on the rounds' log ratios of medians, widened to the pooled bootstrap's
    interval where that is wider; with fewer, the pooled bootstrap alone (which takes the calls as
    independent, too narrow when the rounds disagree)."""
    pooled = bootstrap_speedup_ci(ref_ms, cand_ms, samples, seed)
    logs = []
    for (a, b), (c, d) in rounds(blocks):
        r, k = ref_ms[a:b], cand_ms[c:d]
        if r and k and median(k) > 0 and median(r) > 0:
            logs.append(float(np.log(median(r) / median(k))))
    if len(logs) < MIN_ROUNDS or pooled is None:
        return pooled
    n = len(logs)
    half = _T975[min(n - 1, len(_T975)) - 1] * float(np.std(logs, ddof=1)) / n**0.5
    mid = float(np.mean(logs))
    return min(pooled[0], float(np.exp(mid - half))), max(pooled[1], float(np.exp(mid + half)))


# On the CPU clock an identical program's calls run longer in the candidate's process than in the
# reference worker, by a cost per call that no number of samples removes (its cause is not pinned
# down: the candidate's process has just woken from the handoff's message, the worker's own calls
# follow each other; the measurements are at cudal1.speedup.CPU_CALL_FLOOR_MS, the bound of the
# same cost that the verdict's claims use).  The candidate's median may hold up to this much
# (never more than half of itself) that the reference's does not.
CPU_PROTOCOL_MS = CPU_CALL_FLOOR_MS


def cpu_protocol_ci(ci: tuple[float, float] | None, cand_median_ms: float) -> tuple[float, float] | None:
    """``ci`` with its upper bound raised to what the speedup would be without the protocol's cost
    per call (:data:`CPU_PROTOCOL_MS`, at most half the candidate's median): the bias runs only
    against the candidate, so only the upper side moves, and no claim of "faster" can come from
    it.  Noticeable on calls under a few milliseconds (x2 at most, on the shortest calls)."""
    if ci is None or cand_median_ms <= 0:
        return ci
    cost = min(CPU_PROTOCOL_MS, cand_median_ms / 2)
    return ci[0], ci[1] * cand_median_ms / (cand_median_ms - cost)


# A timed process's threads waited this share of their runnable time for a CPU: contended.  On the
# CPU clock the share is read inside the calls (hostload.BlockLoad per_call): an identical program
# on a quiet 2-core host waits a median 7% of it (bound threads), beside two busy processes 25-38%.
# On a GPU it is the whole block's: quiet hosts up to about a fifth (the processes' wake-ups).
HOST_WAIT_SHARE = 0.25


def host_contention(load: dict[str, Any]) -> dict[str, Any]:
    """Host contention during the timing blocks, from the clean worker's counters
    (:mod:`cudal1.harness.reference.hostload`): each side's median wait share, the runnable tasks beside the
    reader, and ``contended`` when a side's threads waited more than :data:`HOST_WAIT_SHARE` of
    their runnable time for a CPU."""
    shares = {who: [float(x) for x in (load.get("wait_share") or {}).get(who) or []] for who in ("ref", "cand")}
    if not shares["ref"] or not shares["cand"]:
        return {}
    out: dict[str, Any] = {"wait_share": {"reference": median(shares["ref"]), "candidate": median(shares["cand"])},
                           "cpus": int(load.get("cpus") or 0)}
    running = [int(x) for x in load.get("runnable") or []]
    if running:
        out["runnable"] = median([float(x) for x in running])
    out["contended"] = max(out["wait_share"].values()) > HOST_WAIT_SHARE
    return out


def speedup(ref_median_ms: float, cand_median_ms: float) -> float:
    return ref_median_ms / max(cand_median_ms, 1e-12)


