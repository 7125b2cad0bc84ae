"""Checking a response's Performance Analysis against what its prompt showed (pure; no torch).

CUDA-L1's contrastive prompt asks the model to say, before it writes code, why the faster earlier
implementations beat the slower ones.  :func:`check_analysis` reads the analysis section
(:func:`cudal1.prompts.parse_response` extracts it) next to the prompt's user message and returns
an :class:`AnalysisCheck`:

* ``present``: the section has at least :data:`MIN_WORDS` words;
* ``shown`` / ``best``: how many earlier implementations the prompt showed (``### Implementation
  i: speedup S``, slowest first, so the best is the last) and the best one's index;
* ``names_best``: the analysis refers to that best implementation — by its number
  ("Implementation 3", "#3", "version 3") or by its speedup as shown ("2.13x");
* ``cites_speedups``: it quotes at least one shown speedup (any of them);
* ``compares``: it refers to at least two of the shown implementations (numbers or speedups);
* ``reasons``: the families of cause it names (:data:`REASONS`: memory traffic, kernel launches,
  fusion, parallelism, algorithmic work, precision), each found by whole words;
* ``score`` in [0, 1]: with exemplars shown, a quarter each for present, names_best,
  cites_speedups and reasons (at least one family); with none shown (a one-shot prompt), half for
  present and half for reasons.

The score rewards an analysis that engages with the evidence it was given; it cannot tell whether
the explanation is *right*.  It is cudal1's measure, not the paper's: CUDA-L1 asks for the
analysis but does not score it.  Rewarding it is off by default (``reward.analysis_bonus``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

MIN_WORDS = 15
_SHOWN = re.compile(r"^### Implementation (\d+): speedup (\S+)", re.MULTILINE)
REASONS: dict[str, tuple[str, ...]] = {
    "memory": ("memory", "bandwidth", "coalesc", "cache", "caching", "global memory", "shared memory", "traffic",
               "load", "loads", "store", "stores", "materializ", "materialis", "allocation", "copy", "copies"),
    "launches": ("launch", "launches", "overhead", "synchroniz", "synchronis", "kernel calls"),
    "fusion": ("fuse", "fused", "fusing", "fusion"),
    "parallelism": ("thread", "threads", "block", "blocks", "warp", "warps", "occupancy", "parallel", "parallelism",
                    "vectoriz", "vectoris"),
    "algorithm": ("flop", "flops", "complexity", "redundant", "algorithm", "algorithmic", "o(n", "quadratic", "cubic",
                  "broadcast", "matmul", "matrix multiplication"),
    "precision": ("precision", "fp16", "bf16", "tf32", "half"),
}


@dataclass(frozen=True)
class AnalysisCheck:
    """What a Performance Analysis engages with (see the module docstring)."""

    present: bool = False
    words: int = 0
    shown: int = 0  # earlier implementations the prompt showed
    best: int | None = None  # the best one's number (the last shown)
    names_best: bool = False
    cites_speedups: bool = False
    compares: bool = False
    reasons: list[str] = field(default_factory=list)
    score: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shown_implementations(user: str) -> list[tuple[int, str]]:
    """(number, speedup text as shown, e.g. ``"2.13x"``) of each implementation in a prompt's user message."""
    return [(int(m.group(1)), m.group(2)) for m in _SHOWN.finditer(user or "")]


def _mentions_number(text: str, n: int) -> bool:
    return re.search(rf"(?:implementation|version|variant|attempt|candidate|#)\s*#?\s*{n}\b", text) is not None


def _mentions_speedup(text: str, shown: str) -> bool:
    if not shown.endswith("x"):
        return False
    value = shown[:-1]
    return re.search(rf"(?<![\d.]){re.escape(value)}\s*(?:x|×|times)", text) is not None


def _reasons(text: str) -> list[str]:
    found = []
    for family, words in REASONS.items():
        if any(re.search(rf"(?<![a-z]){re.escape(w)}", text) for w in words):
            found.append(family)
    return found


def check_analysis(analysis: str, user: str = "") -> AnalysisCheck:
    """Check ``analysis`` against the prompt's user message ``user`` (see the module docstring)."""
    text = (analysis or "").lower()
    words = len(re.findall(r"[a-z0-9]+", text))
    present = words >= MIN_WORDS
    shown = shown_implementations(user)
    reasons = _reasons(text) if present else []
    if not shown:
        score = 0.5 * present + 0.5 * bool(reasons)
        return AnalysisCheck(present, words, 0, None, reasons=reasons, score=score)
    best_n, best_speedup = shown[-1]
    names_best = present and (_mentions_number(text, best_n) or _mentions_speedup(text, best_speedup))
    referred = {n for n, s in shown if _mentions_number(text, n) or _mentions_speedup(text, s)} if present else set()
    cites = present and any(_mentions_speedup(text, s) for _, s in shown)
    score = 0.25 * (present + names_best + cites + bool(reasons))
    return AnalysisCheck(present, words, len(shown), best_n, names_best, cites, len(referred) >= 2, reasons, score)


__all__ = ["MIN_WORDS", "REASONS", "AnalysisCheck", "check_analysis", "shown_implementations"]
