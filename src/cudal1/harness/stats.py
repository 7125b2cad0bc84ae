"""Statistics on timing samples, computed in the parent from the raw samples a worker sent.

The speedup is ``median(reference) / median(candidate)``; its 95% confidence interval is a
percentile bootstrap that resamples both sample sets independently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def bootstrap_speedup_ci(ref_ms: list[float], cand_ms: list[float], samples: int = 1000, seed: int = 0) -> tuple[float, float] | None:
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


def speedup(ref_median_ms: float, cand_median_ms: float) -> float:
    return ref_median_ms / max(cand_median_ms, 1e-12)


@dataclass
class Charge:
    """Charged times and the side-stream decision for one timing run."""

    ref_ms: list[float]
    cand_ms: list[float]
    side_stream: bool
    base_ms: float  # fixed join cost subtracted from device-wide times
    cand_excess_ms: float  # median device-wide excess of the candidate's calls over the base


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else 0.0


def _iqr(xs: list[float]) -> float:
    return float(np.subtract(*np.percentile(xs, [75, 25]))) if len(xs) >= 2 else 0.0


def charge(ref_stream: list[float], ref_device: list[float], cand_stream: list[float], cand_device: list[float],
           calibration: list[float]) -> Charge:
    """Turn raw two-clock samples into charged times.

    The join cost ``base`` is the larger of the calibrated busy-call excess and the reference's
    own median excess (the reference is trusted eager code on the calling stream).  Every call,
    reference and candidate alike, is charged ``max(stream, device − base)``, so work that
    escaped the calling stream is paid for.  The candidate is judged ``side_stream`` when its
    median excess exceeds the base by more than the noise (``max(15 us, 3 × IQR of the
    reference's excess, 5% of its stream time)``).  On the CPU both clocks agree and nothing
    changes.
    """
    ref_excess = [d - s for s, d in zip(ref_stream, ref_device)]
    cand_excess = [d - s for s, d in zip(cand_stream, cand_device)]
    base = max(_median(calibration), _median(ref_excess))
    slack = max(0.015, 3 * _iqr(ref_excess), 3 * _iqr(calibration), 0.05 * _median(cand_stream))
    ref_ms = [max(s, d - base) for s, d in zip(ref_stream, ref_device)]
    cand_ms = [max(s, d - base) for s, d in zip(cand_stream, cand_device)]
    excess = _median(cand_excess) - base
    return Charge(ref_ms, cand_ms, excess > slack, base, excess)
