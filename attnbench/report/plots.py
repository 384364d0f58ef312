"""The report's figures, drawn with matplotlib (the ``plot`` extra).

Each function takes rows or tables and returns a figure, or ``None`` when the rows hold
nothing to draw (say, no row whose memory was both modeled and measured): an empty axis
would look like a result. Every figure has the same size, so a report's pages line up and a
test can check the PNGs' dimensions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnbench.report.marks import MISSING
from attnbench.report.ratio import label, unnamed
from attnbench.report.tables import RatioTable
from attnbench.row import Row, as_rows, shown
from attnbench.workload import label_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SIZE_IN = (6.4, 4.2)
DPI = 100  # PNGs are 640 × 420 pixels
PNG_PIXELS = (round(SIZE_IN[0] * DPI), round(SIZE_IN[1] * DPI))
# a legend entry or title longer than this is cut (marked): a row's free text can be a
# megabyte, and at 200 characters a legend is wider than the figure (its axes collapse)
TEXT_CHARS = 120


@dataclass(frozen=True)
class Plot:
    """A figure of the report: ``plots/<stem>.png`` and ``.svg``, shown with its caption."""

    stem: str
    figure: Figure
    caption: str


def literal_text(value: Any) -> str:
    """A row's text as matplotlib shows it literally: on one line, cut short, and every
    ``$`` escaped (two of them would start mathtext, and bad mathtext raises in savefig)."""
    return shown(str(value), TEXT_CHARS).replace("$", r"\$")


def available() -> str | None:
    """None if matplotlib can be imported, else the one line that says how to get it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "plots need matplotlib: pip install 'attnbench[plot]'"
    return None


def new_figure() -> tuple[Figure, Any]:
    """A figure of the report's one size and its axes: every report's figures start here, so
    that their pages line up and their PNGs are :data:`PNG_PIXELS`."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    fig = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def _series(rows: list[Row], y: str) -> dict[str, list[tuple[int, float]]]:
    """One line per mechanism and budget (``linformer (...) k=128``), points (n, y)."""
    # fp16 and fp32 rows: two lines, not a zigzag (causal and compiled, the setting's last
    # parts, are in the label already)
    many = len({unnamed(r) for r in rows}) > 1
    out: dict[tuple[str, int, str], list[tuple[int, float]]] = {}
    for r in rows:
        v = getattr(r, y)
        if r.status != "ok" or not v or (y == "time_per_seq_s" and r.busy):
            continue  # a busy time is no figure: left out, and the title says so
        where = ""
        if many:
            batch = r.batch_asked
            work = label_of(r)
            where = f" [{work}, {r.dtype}, b={batch}, ceiling {r.ceiling_bytes}]"
        out.setdefault((label(r), r.k or 0, where), []).append((r.n, float(v)))
    return {
        name + (f" k={k}" if k else "") + where: sorted(points)  # k in numeric order
        for (name, k, where), points in sorted(out.items())
    }


def _lines(ax: Any, series: dict[str, list[tuple[int, float]]], ylabel: str) -> None:
    """A line per series; a series of one point is drawn as a ring its legend says is one n
    (a line's small marker alone reads as a speck, not as a measurement)."""
    for name, points in series.items():
        one = len(points) == 1
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            ms=7 if one else 3,
            mfc="none" if one else None,
            mew=1.5 if one else None,
            label=literal_text(name + (f" (n = {points[0][0]} only)" if one else "")),
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=6, loc="best")


def _against_n(
    rows: Iterable[Row | dict[str, Any]], y: str, ylabel: str, where: Callable[[Row], str]
) -> Figure | None:
    """One log–log figure of ``y`` against n; the title says how the figures were taken."""
    rows = as_rows(rows)
    series = _series(rows, y)
    if not series:
        return None
    fig, ax = new_figure()
    _lines(ax, series, ylabel)
    how = sorted({where(r) for r in rows if getattr(r, y)})
    busy = sum(r.busy for r in rows if y == "time_per_seq_s" and getattr(r, y))
    gone = f"; {busy} left out: machine busy" if busy else ""
    title = literal_text(f"{ylabel} ({', '.join(how)}{gone})")
    drawn = sum(len(points) for points in series.values())
    if none := len(rows) - drawn - busy:  # not timed, out of memory: the tables say which
        title += "\n" + literal_text(
            f"no figure at {none} of {len(rows)} cells: the tables say why"
        )
    ax.set_title(title, fontsize=9)
    return fig


def time_vs_n(rows: Iterable[Row | dict[str, Any]]) -> Figure | None:
    """Inference time per sequence against n, log–log: the paper's Figure 2 (top right)."""
    return _against_n(
        rows,
        "time_per_seq_s",
        "time per sequence (s)",
        lambda r: f"timed on {r.time_device} {r.time_dtype} b={r.time_batch}",
    )


def batch_vs_n(rows: Iterable[Row | dict[str, Any]]) -> Figure | None:
    """Maximum batch under the ceiling against n; a model that cannot fit b = 1 has no point."""
    return _against_n(rows, "max_batch", "maximum batch size", lambda r: str(r.memory_source))


def speedup_limits(values: Iterable[float]) -> tuple[float, float]:
    """The heat map's colour range: centred on 1 (as fast as the baseline) in log scale and
    at least 1/2 to 2, so that a colour says faster or slower and by how much, whatever
    few cells have a figure (a range drawn tight around two speed-ups of 1.4 and 1.65 would
    paint them as opposites)."""
    widest = max((abs(math.log(v)) for v in values if v > 0), default=0.0)
    top = math.exp(max(widest, math.log(2)))
    return 1 / top, top


def speedup_heatmap(table: RatioTable) -> Figure | None:
    """The time ratio table as a heat map over n × k, each cell labelled with its text:
    blue faster than the baseline, red slower, grey no figure (the table says why)."""
    if table.kind != "time" or not table.ks or all(v is None for v in table.value.values()):
        return None
    import matplotlib
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    grid = np.array(
        [
            [math.nan if table.value[(n, k)] is None else table.value[(n, k)] for k in table.ks]
            for n in table.ns
        ]
    )
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad=(0, 0, 0, 0))
    low, high = speedup_limits(v for v in table.value.values() if v is not None)
    fig, ax = new_figure()
    image = ax.imshow(grid, cmap=cmap, norm=LogNorm(low, high), aspect="auto")
    for i, n in enumerate(table.ns):  # grey: a cell with no figure; white: no such cell
        for j, k in enumerate(table.ks):
            if table.value[(n, k)] is None and table.text[(n, k)] != MISSING:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color="#e4e4e4", lw=0))
    bar = fig.colorbar(image, ax=ax, label="speed-up (baseline time ÷ mechanism time)")
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50) if low <= t <= high]
    bar.set_ticks(ticks, labels=[f"{t:g}x" for t in ticks])
    bar.minorticks_off()
    ax.set_xticks(range(len(table.ks)), [str(k) for k in table.ks])
    ax.set_yticks(range(len(table.ns)), [str(n) for n in table.ns])
    ax.set_xlabel(literal_text(table.column))
    ax.set_ylabel("n")
    for i, n in enumerate(table.ns):
        for j, k in enumerate(table.ks):
            v = table.value[(n, k)]
            dark = v is not None and not 0.2 < image.norm(v) < 0.8  # the saturated ends
            ax.text(
                j,
                i,
                literal_text(table.text[(n, k)]),
                ha="center",
                va="center",
                fontsize=7,
                color="white" if dark else "black",
            )
    timed = sum(v is not None for v in table.value.values())
    cells = sum(t != MISSING for t in table.text.values())
    counts = f"{timed} of {cells} cells timed; grey: no figure (the table says why)"
    ax.set_title(literal_text(f"speed-up: {table.mechanism}") + "\n" + counts, fontsize=8)
    return fig


def modeled_vs_measured(rows: Iterable[Row | dict[str, Any]]) -> Figure | None:
    """Max batch the memory model predicted against the one found on the GPU, per cell."""
    pairs = [
        (r.predicted_max_batch, r.max_batch, r.attention)
        for r in as_rows(rows)
        if r.memory_source == "measured" and r.predicted_max_batch and r.max_batch
    ]
    if not pairs:
        return None
    fig, ax = new_figure()
    for name in sorted({p[2] for p in pairs}):
        mine = [p for p in pairs if p[2] == name]
        ax.scatter([p[0] for p in mine], [p[1] for p in mine], s=12, label=literal_text(name))
    low = min(min(p[0], p[1]) for p in pairs)
    high = max(max(p[0], p[1]) for p in pairs)
    ax.plot([low, high], [low, high], color="grey", lw=0.8, ls="--", label="modeled = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("modeled max batch")
    ax.set_ylabel("measured max batch")
    ax.legend(fontsize=7)
    ax.set_title("memory model against the device", fontsize=9)
    return fig


def save(fig: Figure, stem: str) -> dict[str, bytes]:
    """The figure as PNG and SVG bytes, keyed by file name."""
    import io

    import matplotlib

    out = {}
    for fmt in ("png", "svg"):
        buf = io.BytesIO()
        # a fixed salt and no date: the same rows give the same bytes (reports/ in git)
        with matplotlib.rc_context({"svg.hashsalt": "attnbench"}):
            fig.savefig(buf, format=fmt, dpi=DPI, metadata={"Date": None} if fmt == "svg" else {})
        out[f"{stem}.{fmt}"] = buf.getvalue()
    return out
