"""Checking a response's Performance Analysis against what its prompt measured (pure; no torch).

CUDA-L1's contrastive prompt asks the model to say, before it writes code, why the faster earlier
implementations beat the slower ones.  :func:`check_analysis` reads the analysis section
(:func:`cudal1.prompts.parse_response` extracts it) next to the prompt's user message and returns
an :class:`AnalysisCheck`.  Every point it gives needs the **measured speedups the prompt showed**
(``### Implementation i: speedup S``, slowest first, so the best is the last): text that does not
read the prompt cannot know them, so boilerplate scores 0 however many causes it lists.

* ``present``: the section has at least :data:`MIN_WORDS` words (nothing below counts without it);
* ``shown`` / ``best``: how many earlier implementations the prompt showed, and the best one's number;
* ``cites_speedups``: it quotes at least one shown speedup ("2.13x", "2.13 times");
* ``names_best``: it quotes the best implementation's measured speedup (naming "Implementation 3"
  without its figure does not count: any text can list numbers);
* ``compares``: it quotes the measured speedups of at least two shown implementations;
* ``reasons``: the families of cause (:data:`REASONS`: memory traffic, kernel launches, fusion,
  parallelism, algorithmic work, precision) named **in a sentence that quotes a shown speedup** —
  a cause tied to a measured program, not a list of GPU words;
* ``score`` in [0, 1]: a third each for names_best, compares and reasons (at least one family).
  A one-shot prompt (no exemplars) shows nothing measured, so its score is 0: there is nothing to
  check an analysis against.

The score tells whether an analysis engages with the measurements it was given, not whether its
explanation is right (profiles of the programs, once recorded, would be the next check).  It is
cudal1's measure, not the paper's: CUDA-L1 asks for the analysis but does not score it.  Rewarding
it is off by default (``reward.analysis_bonus``).
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
    "precision": ("precision", "fp16", "bf16", "tf32", "half-precision", "half precision"),
}


@dataclass(frozen=True)
class AnalysisCheck:
    """What a Performance Analysis engages with (see the module docstring)."""

    present: bool = False
    words: int = 0
    shown: int = 0  # earlier implementations the prompt showed
    best: int | None = None  # the best one's number (the last shown)
    names_best: bool = False  # quotes the best one's measured speedup
    cites_speedups: bool = False  # quotes at least one shown speedup
    compares: bool = False  # quotes the speedups of at least two shown implementations
    reasons: list[str] = field(default_factory=list)  # cause families named in sentences that quote a shown speedup
    score: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shown_implementations(user: str) -> list[tuple[int, str]]:
    """(number, speedup text as shown, e.g. ``"2.13x"``) of each implementation in a prompt's user message."""
    return [(int(m.group(1)), m.group(2)) for m in _SHOWN.finditer(user or "")]


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


def _sentences(text: str) -> list[str]:
    """Sentences (and list items): a decimal point is not an end."""
    return [s for s in re.split(r"(?<!\d)[.!?](?!\d)|[;\n]", text) if s.strip()]


def check_analysis(analysis: str, user: str = "") -> AnalysisCheck:
    """Check ``analysis`` against the prompt's user message ``user`` (see the module docstring)."""
    text = (analysis or "").lower()
    words = len(re.findall(r"[a-z0-9]+", text))
    present = words >= MIN_WORDS
    shown = shown_implementations(user)
    if not shown:
        return AnalysisCheck(present, words)
    best_n, best_speedup = shown[-1]
    if not present:
        return AnalysisCheck(present, words, len(shown), best_n)
    figures = {s for _, s in shown}
    quoted = {s for s in figures if _mentions_speedup(text, s)}
    grounded: set[str] = set()
    for sentence in _sentences(text):
        if any(_mentions_speedup(sentence, s) for s in figures):
            grounded.update(_reasons(sentence))
    reasons = [f for f in REASONS if f in grounded]
    names_best, compares = best_speedup in quoted, len(quoted) >= 2
    score = (names_best + compares + bool(reasons)) / 3
    return AnalysisCheck(present, words, len(shown), best_n, names_best, bool(quoted), compares, reasons, score)


__all__ = ["MIN_WORDS", "REASONS", "AnalysisCheck", "check_analysis", "shown_implementations"]
