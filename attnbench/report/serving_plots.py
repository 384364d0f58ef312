"""Serving's figures (``mode=decode`` rows), drawn as :mod:`attnbench.report.plots` draws
its own: log–log against n, one line per configuration (:func:`attnbench.report.serving.
configuration`, the baseline's among them), one figure per set of rows and batch."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from attnbench.report.plots import Plot, _lines, literal_text, new_figure
from attnbench.report.ratio import compiled
from attnbench.report.serving import MAX, configuration, row_sets
from attnbench.row import Row


def _plots(
    rows: Iterable[Row | dict[str, Any]],
    stem: str,
    caption: str,
    ylabel: str,
    pick: Callable[[Row], bool],
    y: Callable[[Row], float | None],
    timed: bool = False,
) -> list[Plot]:
    """A figure per set of rows of ``y`` against n for the rows ``pick`` keeps (one point
    per configuration and n: the first row's); none where no row has a figure. ``timed``:
    ``y`` is a time, none from a busy row."""
    sets = row_sets(rows)
    out = []
    for i, rows_here in enumerate(sets):
        series: dict[str, dict[int, float]] = {}
        left_out = 0
        for r in rows_here:
            if r.status != "ok" or not pick(r) or not (v := y(r)):
                continue
            if timed and r.busy:  # a busy time is no figure: left out, and the title says so
                left_out += 1
                continue
            series.setdefault(configuration(r), {}).setdefault(r.n, float(v))
        if not series:
            continue
        fig, ax = new_figure()
        _lines(ax, {name: sorted(points.items()) for name, points in series.items()}, ylabel)
        for i, line in enumerate(ax.get_lines()):  # past the 10 colours, other dashes
            line.set_linestyle(("-", "--", ":")[i // 10 % 3])
        ax.legend(fontsize=6, loc="best")
        first = rows_here[0]
        busy = f"; {left_out} left out: machine busy" if left_out else ""
        what = caption.removeprefix("Serving: ").removesuffix(" against n")
        ax.set_title(
            literal_text(
                f"{what}: {first.dtype}, {first.decode_tokens} tokens, {first.device}"
                + (f", {c}" if (c := compiled(first)) else "")
                + busy
            ),
            fontsize=8,
        )
        suffix = f"-{i + 1}" if len(sets) > 1 else ""
        out.append(Plot(stem + suffix, fig, caption + "."))
    return out


def time_per_token(rows: Iterable[Row | dict[str, Any]]) -> list[Plot]:
    """Time per generated token per sequence against n, a figure per fixed batch."""
    rows = list(rows)
    batches = sorted(
        {r.batch_asked for s in row_sets(rows) for r in s if isinstance(r.batch_asked, int)}
    )
    return [
        plot
        for b in batches
        for plot in _plots(
            rows,
            f"serving-time-b{b}",
            f"Serving: time per token at b={b} against n",
            "time per token per sequence (s)",
            lambda r, b=b: r.batch_asked == b,
            lambda r: r.time_per_seq_s,
            timed=True,
        )
    ]


def state_per_sequence(rows: Iterable[Row | dict[str, Any]]) -> list[Plot]:
    """The bytes one sequence keeps at n + decode_tokens against n (every row of any
    batch has them, the same)."""
    return _plots(
        rows,
        "serving-state",
        "Serving: state per sequence against n",
        "bytes per sequence",
        lambda r: True,
        lambda r: r.state_bytes,
    )


def max_batch(rows: Iterable[Row | dict[str, Any]]) -> list[Plot]:
    """The most sequences that fit the ceiling against n (``batch=max`` rows)."""
    return _plots(
        rows,
        "serving-max-batch",
        "Serving: max batch against n",
        "max batch (sequences)",
        lambda r: str(r.batch_asked) == MAX,
        lambda r: r.max_batch,
    )
