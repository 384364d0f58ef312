"""A table of plain text: what a report shows of what is not a ratio table (the efficiency
lengths, the quality tables). Every format prints it the same way, escaping it for itself.
:func:`sig` is the number format the grids of measured figures share (serving's state and
bandwidth, the compiled tables)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Grid:
    """A title, a heading per column, rows of text (the first column names the row) and
    notes under it; plain text, unescaped."""

    title: str
    head: list[str]
    body: list[list[str]]
    notes: list[str]


def sig(v: float) -> str:
    """Three significant digits, never an exponent: ``4836``, ``21.2``, ``0.590``."""
    digits = 2 - math.floor(math.log10(abs(v))) if v else 0
    return f"{v:.{max(digits, 0)}f}"
