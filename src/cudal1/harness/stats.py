"""Statistics on timing samples, computed in the parent from the raw samples a worker sent.

The speedup is ``median(reference) / median(candidate)``; its 95% confidence interval is a
percentile bootstrap that resamples both sample sets independently.
"""

from __future__ import annotations

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
