"""Where the timing phase's wall time goes, on the clean worker's clock.

Contract: :class:`Spans` sums named spans (milliseconds) of the reference worker's timing phase
(warm-up, sealing, the two sides' calls, stopping and resuming the candidate's processes, the
digest checks, the re-checks, the host-load reads); :meth:`Spans.as_dict` is what the verdict
carries (``figures["cost"]``).  It is information for whoever tunes the judge: nothing judges on
it.  Cost: two ``perf_counter`` reads per span.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

_perf = time.perf_counter


class Spans:
    """Named sums of wall time, in ms, plus the phase's total (:meth:`start` to :meth:`as_dict`)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._t0 = _perf()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        t0 = _perf()
        try:
            yield
        finally:
            self.ms[name] = self.ms.get(name, 0.0) + (_perf() - t0) * 1e3

    def as_dict(self) -> dict[str, float]:
        """Each span's ms, ``total_ms`` since construction and ``other_ms`` (total minus the spans;
        a dotted name, ``cand_calls.stage``, is a part of the span before its dot, not counted twice)."""
        total = (_perf() - self._t0) * 1e3
        out = {f"{k}_ms": round(v, 3) for k, v in self.ms.items()}
        out["total_ms"] = round(total, 3)
        out["other_ms"] = round(total - sum(v for k, v in self.ms.items() if "." not in k), 3)
        return out
