"""The compiled document's memory table, a pure function of rows: the CPU profiler's peak of
a compiled step beside the eager step's at the same batch.

Only rows whose peaks the profiler measured (``memory_source`` ``profiled``) have both
figures (the memory model traces the eager graph only), so this table stands apart from the
time tables of :mod:`attnbench.report.compiled`, whose sets of rows
(:func:`~attnbench.report.compiled.compiled_sets`) and labels it shares.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnbench.report.compiled import applies, compiled_sets, plain, where
from attnbench.report.grid import Grid, sig
from attnbench.report.marks import MISSING
from attnbench.row import Row, as_rows, printable


def memory(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per setting and compile mode: the compiled step's peak against the eager step's at
    the same batch, both the CPU profiler's (``memory_source`` ``profiled``)."""
    out = []
    for (_, c), here in compiled_sets([r for r in as_rows(rows) if applies(r)]).items():
        got = [r for r in here if r.status == "ok" and r.memory_source == "profiled"]
        got = [r for r in got if r.peak_bytes and r.eager_peak_bytes]
        order = list(dict.fromkeys(map(plain, got)))
        body = [
            [printable(plain(r)), str(r.n), str(r.batch or MISSING), *_peaks(r)]
            for r in sorted(got, key=lambda r: (order.index(plain(r)), r.n))
        ]
        if body:
            head = ["mechanism", "n", "batch", "eager (MB)", f"{c} (MB)", "eager ÷ compiled"]
            title = f"Peak memory, eager and {c}, profiled on a CPU ({where(here[0])})"
            out.append(Grid(title, head, body, [MEMORY]))
    return out


def _peaks(r: Row) -> list[str]:
    eager, peak = r.eager_peak_bytes, r.peak_bytes
    return [sig(eager / 1e6), sig(peak / 1e6), f"{eager / peak:.2f}x"]


MEMORY = (
    "MB = 10⁶ bytes: the CPU profiler's peak of one step at the batch given, the compiled "
    "step's and the eager step's by the same instrument (the memory model traces the eager "
    "graph only); eager ÷ compiled > 1: the compiled step peaks lower."
)
