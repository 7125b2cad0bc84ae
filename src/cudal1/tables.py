"""The two helpers behind every figure cudal1 prints: one geometric mean and one aligned text
table, shared by the search summary, ``eval-suite``, the report, the CLI and the benchmarks
(pure functions, no torch)."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive finite values (None, zero, negative and non-finite values
    are skipped); None when there are none."""
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals)) if vals else None


def fmt(x: Any, digits: int = 3) -> str:
    """A table cell: '-' for None, ``digits`` significant digits for floats, str() otherwise."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain aligned text table (cells through :func:`fmt`)."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])
