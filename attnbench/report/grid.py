"""A table of plain text: what a report shows of what is not a ratio table (the efficiency
lengths, the quality tables). Every format prints it the same way, escaping it for itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grid:
    """A title, a heading per column, rows of text (the first column names the row) and
    notes under it; plain text, unescaped."""

    title: str
    head: list[str]
    body: list[list[str]]
    notes: list[str]
