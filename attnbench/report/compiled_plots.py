"""The compiled document's figure, drawn as :mod:`attnbench.report.plots` draws its own:
time per sequence against n, log–log, a colour per mechanism, its eager line dashed and its
compiled line solid (flex's eager line is its own kernel compiled in the eager model), one
figure per setting (:func:`attnbench.report.ratio.unnamed`: causal rows are named so)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnbench.report.compiled import applies, plain, wanted
from attnbench.report.plots import Plot, literal_text, new_figure
from attnbench.report.ratio import compiled, unnamed
from attnbench.row import Row, as_rows
from attnbench.workload import label_of

STEM = "compiled-time-vs-n"
CAPTION = (
    "Time per sequence against n (log-log): eager dashed, compiled solid, a colour per mechanism."
)
MARKERS = "osv^D"  # past the ten colours, another marker


def time_vs_n(rows: Iterable[Row | dict[str, Any]]) -> list[Plot]:
    """A figure per setting of the mechanisms that have a compiled row (or are flex): each
    one's time per sequence against n, eager and compiled; busy times left out (the title
    counts them); none where no row has a time."""
    rows = [r for r in as_rows(rows) if applies(r)]
    mechs = {plain(r) for r in rows if wanted(r)}
    sets: dict[tuple, list[Row]] = {}
    for r in rows:
        if plain(r) in mechs:
            sets.setdefault(unnamed(r), []).append(r)
    out = []
    for i, here in enumerate(sets.values()):
        series: dict[tuple[str, str | None], dict[int, float]] = {}
        left_out = 0
        for r in here:
            if r.status != "ok" or not r.time_per_seq_s:
                continue
            if r.busy:  # a busy time is no figure
                left_out += 1
                continue
            series.setdefault((plain(r), compiled(r)), {}).setdefault(r.n, r.time_per_seq_s)
        if not series:
            continue
        fig, ax = new_figure()
        colours = list(dict.fromkeys(m for m, _ in series))
        for (mech, how), points in series.items():
            j = colours.index(mech)
            xs = sorted(points)
            ax.plot(
                xs,
                [points[n] for n in xs],
                color=f"C{j % 10}",
                ls="-" if how else "--",
                marker=MARKERS[j // 10 % len(MARKERS)],
                ms=3,
                label=literal_text(f"{mech} {how}" if how else mech),
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel("time per sequence (s)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=6, loc="best")
        first = here[0]
        busy = f"; {left_out} left out: machine busy" if left_out else ""
        ax.set_title(
            literal_text(
                f"eager and compiled: {label_of(first)}, {first.dtype}, {first.device}{busy}"
            ),
            fontsize=8,
        )
        out.append(Plot(STEM + (f"-{i + 1}" if len(sets) > 1 else ""), fig, CAPTION))
    return out
