"""The marks a report prints where a table has no number, each defined here once, and the
legend that says what they mean.

Two of them used to be an en dash and a hyphen, which no reader tells apart: a figure that
was not measured and a cell that does not exist are different answers. Every table's writer
(Markdown, LaTeX, HTML, the terminal) prints these marks as they are, and each document
says :data:`LEGEND` under its intro; a CSV cell without a number is empty (it is data).
"""

from __future__ import annotations

MISSING = "-"  # no such cell or pair (k >= n, or no row of it), as in the paper's tables
SKIPPED = "n/m"  # the cell exists but this figure was not measured (a footnote says why)
BUSY = "busy"  # timed, but on a contended CPU: no figure (attnbench.measure.contention)
OOM = "OOM"  # does not fit under the ceiling (a footnote says whose)

LEGEND = (
    f"Marks: {SKIPPED}: not measured (its footnote says why); {MISSING}: no such cell or pair "
    f"(k >= n, or no row of it), as in the paper; {OOM}: does not fit under the ceiling (its "
    f"footnote says whose); {BUSY}: timed on a contended CPU, no figure."
)
