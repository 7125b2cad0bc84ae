"""The contrastive prompt's measured section: what one profiled call of each shown program measured.

Contract: :func:`measured_section` renders, for the reference and each shown implementation that
has a profile (:class:`cudal1.profile.model.ProgramProfile`), one heading line (the call's time,
how much of it the device was busy, launches, the class, the bandwidth share of peak) and its top
:data:`TOP_KERNELS` kernels (share of kernel time, total time, launches, name), so the model's
Performance Analysis can cite numbers.  Pure: the same programs give the same text.

Budget and trimming.  The section may take at most ``budget_chars`` characters (default
:data:`BUDGET_CHARS`, about 400 tokens at 4 characters a token); the rest of the prompt is as
before.  Until it fits, in this order:

1. kernel names longer than :data:`NAME_CHARS` are cut in the middle (templates are long);
2. kernel rows are dropped, the lowest share first, from the program showing the most rows (an
   implementation before the reference when they tie), down to one row per program;
3. whole programs are dropped, the slowest implementation first; the reference and the best
   implementation go last;
4. the section is left out.

A candidate's profile comes from its own process and could be forged by it: it is shown to the
model as what that program reported, like its code, and decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from cudal1.profile.model import ProgramProfile
from cudal1.profile.text import pct, short, us

TOP_KERNELS = 5
BUDGET_CHARS = 1600
NAME_CHARS = 80
INTRO = ("## Measured profiles\n\nOne profiled call of each program (after timing, L2 flushed): the call's time, "
         "how much of it the device was busy, kernel launches, the class (launch-bound, memory-bound, compute-bound "
         "or mixed), the share of the device's peak bandwidth, then its top kernels by time: share of kernel time, "
         "total time, launches, name. Your Performance Analysis may cite these numbers.")


@dataclass(frozen=True)
class Shown:
    """A program in the section: its label as the prompt names it, its profile, and its rank for
    trimming (higher stays longer: the reference and the best implementation rank highest)."""

    label: str
    profile: ProgramProfile
    rank: float


def _heading(s: Shown) -> str:
    p = s.profile
    busy = p.busy_us / p.call_us if p.call_us else None
    parts = [f"{us(p.call_us)} call", f"device busy {pct(busy)}", f"{p.launches} launches",
             p.bound.value if p.bound else "unclassified"]
    if p.bandwidth_share is not None:
        parts.append(f"bandwidth {pct(p.bandwidth_share)} of peak")
    return f"### {s.label}: " + ", ".join(parts)


def _row(k, name_chars: int | None) -> str:
    name = short(k.name, name_chars) if name_chars else k.name
    return f"- {pct(k.share)} {us(k.total_us)} x{k.launches} {name}"


def _render(shown: list[Shown], rows: dict[str, int], name_chars: int | None) -> str:
    blocks = []
    for s in shown:
        lines = [_heading(s)] + [_row(k, name_chars) for k in s.profile.kernels[: rows[s.label]]]
        blocks.append("\n".join(lines))
    return INTRO + "\n\n" + "\n\n".join(blocks)


def measured_section(shown: list[Shown], budget_chars: int = BUDGET_CHARS, top: int = TOP_KERNELS) -> str:
    """The section for ``shown`` (in the order given), trimmed to ``budget_chars`` by the rule in
    the module docstring; "" when nothing is profiled or nothing fits."""
    shown = [s for s in shown if s.profile.ok]
    if not shown:
        return ""
    rows = {s.label: min(top, len(s.profile.kernels)) for s in shown}
    text = _render(shown, rows, None)
    if len(text) <= budget_chars:
        return text
    text = _render(shown, rows, NAME_CHARS)
    while len(text) > budget_chars and any(n > 1 for n in rows.values()):
        most = max(shown, key=lambda s: (rows[s.label], -s.rank))
        rows[most.label] -= 1
        text = _render(shown, rows, NAME_CHARS)
    while len(text) > budget_chars and len(shown) > 1:
        shown = [s for s in shown if s is not min(shown, key=lambda s: s.rank)]
        text = _render(shown, rows, NAME_CHARS)
    return text if len(text) <= budget_chars else ""
