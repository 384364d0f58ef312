"""Serving's state and bandwidth grids, pure functions of rows: what one sequence keeps and
what a decode step reads, beside the ratio tables of :mod:`attnbench.report.serving`.

Over the same sets of decode rows as those tables (:func:`~attnbench.report.serving.row_sets`),
columns the same configurations (:func:`~attnbench.report.serving.columns`): the bytes one
sequence's cache or state holds at n + decode_tokens (modeled), and the bandwidth a batch-1
step achieved against the copy bandwidth measured in the same process (the step's floor).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from attnbench.report.grid import Grid, sig
from attnbench.report.marks import BUSY, MISSING, SKIPPED
from attnbench.report.serving import columns, configuration, row_sets, words
from attnbench.row import Row


def state_grids(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per set of rows: the bytes one sequence keeps at n + decode_tokens (MB, every
    configuration, the baseline's too), and the bandwidth a batch-1 step achieved (GB/s and
    its share of the copy bandwidth measured in the same process, with that figure)."""
    out = []
    sets = row_sets(rows)
    for rows_here in sets:
        heads = columns(rows_here)
        ns = sorted({r.n for r in rows_here})
        first = rows_here[0]
        told = words(rows_here, len(sets) > 1)
        state: dict[tuple[int, str], str] = {}
        for r in rows_here:
            if r.state_bytes:
                own = f" ({_mb(r.prompts['own_state_bytes'])})" if r.prompts else ""
                state.setdefault((r.n, heads[configuration(r)]), _mb(r.state_bytes) + own)
        cols = [h for h in heads.values() if any(c == h for _, c in state)]
        at = "the longest prompt" if first.prompts else "n"
        if cols:
            out.append(
                Grid(
                    f"Serving: state per sequence (MB) at {at} + {first.decode_tokens} "
                    f"tokens{told}",
                    ["n", *cols],
                    [
                        [str(n), *(state.get((n, c), MISSING) for c in cols)]
                        for n in ns
                        if any((n, c) in state for c in cols)
                    ],
                    [
                        "MB = 10⁶ bytes: the cache or state one sequence keeps, every layer, "
                        "in its state dtype on the preset's device (modeled, not measured)."
                        + (MIX_NOTE if first.prompts else "")
                    ],
                )
            )
        one = {(r.n, heads[configuration(r)]): r for r in rows_here if str(r.batch_asked) == "1"}
        if grid := _bandwidth(one, ns, list(heads.values()), told):
            out.append(grid)
    return out


MIX_NOTE = (
    " Every cache is allocated for the longest prompt of the draw and the shorter ones are "
    "left-padded to it; in brackets: what a sequence's own prompt needs, the draw's mean."
)


def _mb(v: int | None) -> str:
    return MISSING if v is None else sig(v / 1e6)


def _copies(copies: list[float]) -> str:
    """The copy bandwidths of one n's rows in GB/s: their median, or their range where the
    processes that timed them measured figures over 10 % apart."""
    if not copies:
        return MISSING
    low, high = min(copies), max(copies)
    if high > 1.1 * low:
        return f"{sig(low / 1e9)}–{sig(high / 1e9)}"
    return sig(statistics.median(copies) / 1e9)


def _bandwidth(
    one: dict[tuple[int, str], Row], ns: list[int], heads: list[str], told: str
) -> Grid | None:
    """The bandwidth grid of one set's batch-1 rows; None where none was timed."""
    timed = {c: r for c, r in one.items() if (r.decode or {}).get("bytes_per_s")}
    if not timed:
        return None
    cols = [h for h in heads if any(c == h for _, c in one)]
    body = []
    for n in ns:
        if not any((n, c) in one for c in cols):
            continue
        cells = [str(n)]
        for c in cols:
            r = one.get((n, c))
            d = (r.decode or {}) if r is not None else {}
            if r is None:
                cells.append(MISSING)
            elif r.status != "ok":
                cells.append(r.status or MISSING)
            elif not d.get("bytes_per_s"):
                cells.append(SKIPPED)
            elif r.busy:
                cells.append(BUSY)
            else:
                share = (
                    f" ({d['bytes_per_s'] / d['copy_bytes_per_s']:.0%})"
                    if d.get("copy_bytes_per_s")
                    else ""
                )
                cells.append(sig(d["bytes_per_s"] / 1e9) + share)
        copies = [
            d["copy_bytes_per_s"]
            for (m, _), r in timed.items()
            if m == n and (d := r.decode or {}).get("copy_bytes_per_s")
        ]
        cells.append(_copies(copies))
        body.append(cells)
    return Grid(
        "Serving: bandwidth a decode step achieved at b=1 (GB/s, share of the copy bandwidth)"
        + told,
        ["n", *cols, "copy (GB/s)"],
        body,
        [
            "GB/s = 10⁹ bytes per second: what a step must read (every sequence's cache or "
            "state at the mean context, and the weights) over its median time; in brackets "
            "its share of the copy bandwidth the same process measured; copy: those at n "
            "(their range where they differ by over 10 %: each process measures its own). "
            f"{SKIPPED}: not timed (time_budget_s); {BUSY}: timed on a contended CPU.",
        ],
    )
