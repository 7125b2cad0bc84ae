"""The judge's correctness rules: typed values, no magic keys.

Contract: a :class:`Tolerances` is one rule: ``limits`` (per output dtype, ``(atol, rtol)``
against the reference's own output, :meth:`Tolerances.limit` falling back to one default for a
dtype it does not name) and, for the ``exact`` rule, an :class:`ExactRule` (the float64-answer
rule's factor and per-dtype floors; :mod:`cudal1.harness.numerics` explains it).
:data:`TOLERANCES` names the rules ``EvalConfig.tolerance`` chooses from.  The judge hands the
rule to the clean reference worker and re-checks an ``ok`` verdict with it in the parent; the
candidate's process never holds one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class ExactRule:
    """The exact-answer rule's constants (:mod:`cudal1.harness.numerics` explains the rule): a
    floating output's error against the float64 answer may be ``factor`` times the fp32
    reference's own error, and never has to be smaller than its dtype's floors."""

    factor: float = 16.0
    # dtype -> (floor relative to |exact|, absolute floor per element); other dtypes take float32's
    floors: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=lambda: {
        "float32": (1e-5, 1e-8),
        "float16": (2e-3, 1e-5),
        "bfloat16": (1.6e-2, 1e-4),
    })

    def floor(self, dtype: str) -> tuple[float, float]:
        return self.floors.get(dtype) or self.floors["float32"]


@dataclass(frozen=True)
class Tolerances:
    """A correctness rule: ``limits`` (per output dtype, ``(atol, rtol)`` against the reference's
    own output) and, when set, the exact-answer rule, which judges floating outputs first; the
    limits then judge only what it cannot (integer or float64 outputs, a reference that cannot
    run in float64)."""

    name: str
    limits: Mapping[str, tuple[float, float]]
    exact: ExactRule | None = None

    FALLBACK: ClassVar[tuple[float, float]] = (1e-4, 1e-4)  # a dtype the limits do not name

    def limit(self, dtype: str) -> tuple[float, float]:
        """``(atol, rtol)`` for an output of ``dtype``."""
        return self.limits.get(dtype, self.FALLBACK)


_STRICT = {
    "float64": (1e-7, 1e-7), "float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2),
    "float8_e4m3fn": (1e-1, 1e-1), "float8_e5m2": (1e-1, 1e-1),
}
# ``exact`` (the default) judges floating outputs against the reference run in float64, with
# ``strict``'s limits for what it cannot judge.  The fixed rules compare with the fp32 reference
# only: ``kernelbench-v0`` is the 1e-2 that KernelBench's published numbers used, kept for
# comparability.
TOLERANCES: dict[str, Tolerances] = {
    "exact": Tolerances("exact", dict(_STRICT), ExactRule()),  # each rule its own table
    "strict": Tolerances("strict", dict(_STRICT)),
    "kernelbench-v0": Tolerances("kernelbench-v0", {
        "float64": (1e-2, 1e-2), "float32": (1e-2, 1e-2), "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2),
        "float8_e4m3fn": (1e-1, 1e-1), "float8_e5m2": (1e-1, 1e-1),
    }),
}
