"""Text tables and the one geometric mean behind every figure cudal1 prints: shared by the search
summary, ``judge-suite``, the report (Markdown, HTML), the CLI and the benchmarks (pure functions,
no torch).  Not plots: those are ``report/plots.py``."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive finite values (None, zero, negative and non-finite values
    are skipped); None when there are none."""
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals)) if vals else None


def fmt(x: Any, pct: bool = False, digits: int = 3) -> str:
    """A table cell: '-' for None; a share as a whole percentage with ``pct``; floats to
    ``digits`` significant digits with trailing zeros kept (1.005 reads "1.00", not "1"), no
    decimals from 100 up; str() otherwise."""
    if x is None:
        return "-"
    if pct:
        return f"{100 * x:.0f}%"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if abs(x) >= 100:
            return f"{x:.0f}"
        if abs(x) >= 1e-3:
            return f"{x:#.{digits}g}".rstrip(".")
        return f"{x:.{digits}g}"
    return str(x)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain aligned text table (cells through :func:`fmt` unless already strings)."""
    cells = [[c if isinstance(c, str) else fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])
