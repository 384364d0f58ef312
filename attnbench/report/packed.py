"""Variable lengths: one draw of documents padded, packed and bucketed (``mode=packed`` and
``packed_train`` rows). Pure functions of rows and of two facts of the mechanisms that no row
holds, how each packs and which cannot: the caller hands them in (:class:`Packs`, from
:func:`attnbench.registry.packing`), since the sweep leaves out the cells that cannot pack.

Per draw (its lengths, n, model, dtype, device, workload) one table: a row per mechanism, per
layout its time per 1000 real tokens and that time against padded vanilla's (> 1: faster than
the Transformer padded), the most real tokens that fit under the ceiling (max batch × the
draw's real tokens), then packing's speed-up over padding, the padded layout's wasted FLOP
share (from the formulas) and how the mechanism packs; under it, the mechanisms that cannot
pack and why. Times are per copy of the draw, so every layout's is for the same real tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from attnbench.report.grid import Grid, sig
from attnbench.report.marks import MISSING, SKIPPED
from attnbench.report.ratio import label
from attnbench.report.tables import context
from attnbench.row import Row, as_rows, printable
from attnbench.workload.packed import LAYOUTS, PACKED_LAYOUT, PADDED, is_packed

BASELINE = "vanilla"


class Draw(NamedTuple):
    """What one table's rows share: the workload, the draw, the shape and where it ran."""

    mode: str
    optimizer: str | None
    lengths: tuple[int, ...]
    n: int
    model: tuple[tuple[str, Any], ...]
    dtype: str
    device: str


class Packs(NamedTuple):
    """What the mechanisms say of packing, by name: how each keeps packed documents apart,
    and why those that cannot pack cannot. A mechanism named in neither (a plugin's not loaded
    where the report is made) is shown as missing."""

    how: dict[str, str]
    cannot: dict[str, str]


class Point(NamedTuple):
    """One mechanism on one draw in the figure: x, y and the name beside it."""

    wasted_pct: float
    speedup: float
    mechanism: str


def applies(row: Row) -> bool:
    return row.task == "cost" and is_packed(row)


def _draw(row: Row) -> Draw:
    return Draw(
        mode=row.mode,
        optimizer=getattr(row, "optimizer", None),
        lengths=tuple(row.packed["lengths"]),
        n=row.n,
        model=tuple(sorted((row.model or {}).items())),
        dtype=row.dtype,
        device=row.device,
    )


def _per_ktok(row: Row | None) -> float | None:
    """Seconds per 1000 real tokens: the time per copy of the draw over its real tokens."""
    if row is None or row.status != "ok" or row.time_per_seq_s is None:
        return None
    return row.time_per_seq_s / row.packed["real_tokens"] * 1000


def layout_tables(rows: Iterable[Row | dict[str, Any]], packs: Packs) -> list[Grid]:
    """One table per draw (module docstring)."""
    groups: dict[Draw, dict[tuple[str, str], Row]] = {}
    for r in as_rows(rows):
        if applies(r):
            groups.setdefault(_draw(r), {})[(label(r), r.layout)] = r
    out = []
    for key, at in groups.items():
        names = list(dict.fromkeys(name for name, _ in at))
        base = next((at[(n, PADDED)] for n in names if (n, PADDED) in at
                     and at[(n, PADDED)].attention == BASELINE), None)  # fmt: skip
        base_t = _per_ktok(base)
        body = []
        for n in names:
            line = [n]
            for layout in LAYOUTS:
                r = at.get((n, layout))
                t = _per_ktok(r)
                none = MISSING if r is None else SKIPPED  # no row, or a row not timed
                line.append(none if t is None else sig(t * 1e3))
                line.append(none if t is None or base_t is None else f"{base_t / t:.2f}x")
                fits = None if r is None or r.max_batch is None else r.max_batch
                line.append(MISSING if fits is None else str(fits * r.packed["real_tokens"]))
            padded, packed = (_per_ktok(at.get((n, x))) for x in (PADDED, PACKED_LAYOUT))
            line.append(MISSING if not padded or not packed else f"{padded / packed:.2f}x")
            any_row = next(at[(n, x)] for x in LAYOUTS if (n, x) in at)
            padded_row = at.get((n, PADDED))
            wasted = None if padded_row is None else padded_row.packed.get("flops_wasted_share")
            line.append(MISSING if wasted is None else f"{100 * wasted:.0f} %")
            line.append(_how(any_row.attention, packs))
            body.append(line)
        first = next(iter(at.values()))
        record = first.packed
        drawn = (
            "explicit lengths"
            if first.lengths is not None
            else f"{first.distribution}, mean "
            f"{first.length_mean}, min {first.length_min}, seed {first.length_seed}"
        )
        title = (
            f"{first.mode}: {drawn}: {record['documents']} documents, {record['real_tokens']} "
            "real tokens "
            f"(longest {record['max_len']}, {100 * record['padding_share']:.0f} % of the "
            f"padded layout is padding), n = {key.n}"
        )
        work = f"{first.mode}: documents of real lengths in three layouts, "
        rows_here = [first, *at.values()]
        out.append(Grid(title, list(HEAD), body, [NOTE, *_cannot(packs), context(rows_here, work)]))
    return out


def _how(attention: str, packs: Packs) -> str:
    if attention in packs.cannot:
        return "cannot"
    return printable(packs.how[attention]) if attention in packs.how else MISSING


def _cannot(packs: Packs) -> list[str]:
    """Every mechanism that cannot pack, with its reason."""
    return [f"{name} cannot pack: {printable(why)}" for name, why in packs.cannot.items()]


HEAD = (
    "mechanism",
    "padded ms / 1k tok", "× padded vanilla", "padded max tokens",
    "packed ms / 1k tok", "× padded vanilla", "packed max tokens",
    "bucketed ms / 1k tok", "× padded vanilla", "bucketed max tokens",
    "packing's speed-up", "padded wasted FLOPs", "how it packs",
)  # fmt: skip
NOTE = (
    "ms / 1k tok: time per copy of the draw over its real tokens, × 1000; × padded vanilla: "
    "padded vanilla's time over this one's (> 1: faster); max tokens: the max batch of copies "
    "under the ceiling × the draw's real tokens; packing's speed-up: padded time over packed; "
    "padded wasted FLOPs: 1 − (each document alone) ÷ (the padded layout), from the formulas."
)


def waste_against_speedup(rows: Iterable[Row | dict[str, Any]]) -> list[Any]:
    """A figure per workload: each mechanism's packing speed-up (padded time over packed)
    against the padded layout's wasted FLOP share, one marker per draw, the mechanism named
    beside each point: how much of what padding wastes packing wins back."""
    from attnbench.report.plots import Plot, literal_text, new_figure

    points: dict[str, dict[Draw, list[Point]]] = {}
    at: dict[tuple[Draw, str], dict[str, Row]] = {}
    for r in as_rows(rows):
        if applies(r) and r.status == "ok" and not r.busy:
            at.setdefault((_draw(r), label(r)), {})[r.layout] = r
    for (draw, _), layouts in at.items():
        padded, packed = layouts.get(PADDED), layouts.get(PACKED_LAYOUT)
        slow, fast = _per_ktok(padded), _per_ktok(packed)
        if padded is None or not slow or not fast:
            continue
        wasted = padded.packed["flops_wasted_share"]
        points.setdefault(draw.mode, {}).setdefault(draw, []).append(
            Point(100 * wasted, slow / fast, padded.attention)
        )
    out = []
    for mode, draws in points.items():
        fig, ax = new_figure()
        for (draw, pts), marker in zip(draws.items(), "osD^v", strict=False):
            which = f"{len(draw.lengths)} documents, longest {max(draw.lengths)}"
            ax.scatter([p.wasted_pct for p in pts], [p.speedup for p in pts], marker=marker,
                       s=18, label=literal_text(which))  # fmt: skip
            for p in pts:
                ax.annotate(literal_text(p.mechanism), (p.wasted_pct, p.speedup), fontsize=5,
                            xytext=(3, 2), textcoords="offset points")  # fmt: skip
        ax.set_xlabel("padded layout's wasted FLOPs (%)")
        ax.set_ylabel("packing's speed-up over padding (×)")
        ax.legend(fontsize=6, loc="best")
        ax.set_title(
            literal_text(f"{mode}: what padding wastes, what packing wins back"), fontsize=8
        )
        caption = (
            f"{mode}: packing's speed-up over padding against the padded layout's wasted FLOP "
            "share (from the formulas), a point per mechanism and draw."
        )
        out.append(Plot(f"packed-waste-vs-speedup-{mode}", fig, caption))
    return out
