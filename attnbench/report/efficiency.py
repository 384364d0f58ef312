"""Efficiency length: the shortest n at which a mechanism beats a baseline.

The question users bring ("which attention for my n?") has a one-number answer per pair of
mechanisms: below some n the Transformer's attention is faster (its n² work is small and its
kernels are better tuned), above it the efficient one wins. For each mechanism (with its
parameters and budget) and setting, against a baseline at the same setting
(:func:`attnbench.report.ratio.group`: n, dtype, preset, model, mode, causal, ...):

* **time**: the smallest n whose time ratio (baseline time ÷ mechanism time) exceeds 1;
* **memory**: the smallest n whose max batch exceeds the baseline's (or at which the
  baseline no longer fits at b = 1 and the mechanism does).

Both read each n's ratio from :func:`attnbench.report.ratio.ratio`, the tables' own: where
it is undefined there is no point, but for one case, which the ratio itself flags
(``outgrown``): the baseline does not fit one sequence and the mechanism does, which for
memory is the mechanism ahead, with no ratio to interpolate towards.

Between two swept n the crossing is interpolated, linearly in log n against log ratio, and
marked ``≈`` (it was not measured there). A mechanism already ahead at the smallest swept n
gets ``≤ n``; one never ahead gets ``> n`` (the largest n compared), never a made-up figure.
Where the ratio falls back below 1 after the crossing, the entry says so; a mechanism with no
n at which both have a figure (a CPU run whose times were estimated over its budget, xformers
without CUDA) gets ``n/m`` and a note of why, by n: a blank cell would say nothing. Pure
functions of rows, like :mod:`attnbench.report.tables`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from attnbench.report.grid import Grid
from attnbench.report.marks import BUSY, MISSING, SKIPPED
from attnbench.report.ratio import baselines as baseline_rows
from attnbench.report.ratio import compared, group, name, ratio, setting
from attnbench.row import Row, as_rows, printable

KINDS = ("time", "memory")


@dataclass(frozen=True)
class Length:
    """One mechanism's efficiency length against one baseline, for one kind."""

    mechanism: str  # label with parameters and budget
    baseline: str
    kind: str  # "time" or "memory"
    n: float | None  # the crossing (interpolated or swept); None when never ahead
    text: str  # what a table prints: "≈ 1 410", "≤ 256", "> 2048", "n/m"
    between: tuple[int, int] | None  # the swept n on either side of an interpolated crossing
    compared: tuple[int, ...]  # the n at which both had a figure
    note: str = ""  # e.g. "behind again at n = 8192"
    # the n compared before it is first ahead whose ratio is under 1: the baseline ahead
    # there (serving: a fixed state bigger than the cache at short n)
    behind: tuple[int, ...] = ()


def _ahead(v: float | None) -> bool:
    return v is None or v > 1


def crossing(
    points: list[tuple[int, float | None]],
) -> tuple[float | None, str, tuple | None, str]:
    """(n, text, between, note) for ``points`` = [(n, ratio)] sorted by n; a ratio of
    None is ahead with no figure (the baseline did not fit one sequence)."""
    if not points:
        return None, SKIPPED, None, "no n with both figures"
    first = next((i for i, (_, v) in enumerate(points) if _ahead(v)), None)
    if first is None:
        return None, f"> {points[-1][0]}", None, ""
    n1, v1 = points[first]
    later = [n for n, v in points[first + 1 :] if not _ahead(v)]
    note = f"behind again at n = {', '.join(map(str, later))}" if later else ""
    if first == 0:
        return float(n1), f"≤ {n1}", None, note
    n0, v0 = points[first - 1]
    if v1 is None or v0 is None or v0 <= 0:  # no ratio to interpolate towards
        return None, f"{n0}–{n1}", (n0, n1), note
    # log-log: the ratios of n-power costs are straight lines there
    f = (0 - math.log(v0)) / (math.log(v1) - math.log(v0)) if v1 != v0 else 1.0
    n = math.exp(math.log(n0) + f * (math.log(n1) - math.log(n0)))
    return n, f"≈ {round(n)}", (n0, n1), note


def budgeted(row: Row) -> str:
    """A mechanism's name in the table: :func:`~attnbench.report.ratio.name` and its k."""
    return name(row) + (f" k={row.k}" if row.k else "")


def efficiency_lengths(
    rows: Iterable[Row | dict[str, Any]],
    baselines: Iterable[str] = ("vanilla", "sdpa"),
    *,
    kinds: Iterable[str] = KINDS,
    label: Callable[[Row], str] = budgeted,
) -> list[Length]:
    """Every mechanism's efficiency length against each baseline the rows hold, per
    setting, for each of ``kinds``; in the rows' order of mechanisms, each named by
    ``label`` (rows of one label and setting are one mechanism's points). A mechanism with
    no n at which both have a figure gets ``n/m`` and a note saying why, never a blank."""
    rows = as_rows(rows)
    out: list[Length] = []
    for baseline in baselines:
        base = baseline_rows(rows, baseline)
        if not base:
            continue
        groups: dict[tuple, list[Row]] = {}
        for r in compared(rows, baseline):
            groups.setdefault((label(r), setting(r)), []).append(r)
        settings = {k[1:] for k in base}
        for (mech, where), mrows in groups.items():
            if where not in settings:  # no baseline row at this setting (say, causal)
                continue
            for kind in kinds:
                points, busy, why = _points(kind, sorted(mrows, key=lambda r: r.n), base)
                n, text, between, note = crossing(points)
                first = next((i for i, (_, v) in enumerate(points) if _ahead(v)), len(points))
                behind = tuple(m for m, v in points[:first] if v is not None and v < 1)
                if not points:
                    note = "no n with both figures: " + "; ".join(
                        f"{w} (n = {', '.join(map(str, ns))})" for w, ns in why.items()
                    )
                elif busy:
                    gone = ", ".join(map(str, busy))
                    note = "; ".join(filter(None, [note, f"n = {gone} left out: machine busy"]))
                out.append(
                    Length(
                        printable(mech),
                        baseline,
                        kind,
                        n,
                        text,
                        between,
                        tuple(p[0] for p in points),
                        note,
                        behind,
                    )
                )
    return out


def _points(
    kind: str, mrows: list[Row], base: dict[tuple, Row]
) -> tuple[list[tuple[int, float | None]], list[int], dict[str, list[int]]]:
    """One mechanism's ``kind`` ratios against its baseline rows, by n: the points
    (:func:`crossing`'s), the n whose time was taken on a busy machine, and, by reason, the
    n with no figure (what a mechanism without a point says instead of a length)."""
    points: list[tuple[int, float | None]] = []
    busy: list[int] = []
    why: dict[str, list[int]] = {}
    for r in mrows:
        b = base.get(group(r))
        if b is None:
            why.setdefault("no baseline row", []).append(r.n)
            continue
        got = ratio(kind, r, b)
        if got.text == BUSY:  # no figure, and the table says which n it lacks
            busy.append(r.n)
            why.setdefault("machine busy", []).append(r.n)
        elif got.value is not None:
            points.append((r.n, got.value))
        elif kind == "memory" and got.outgrown:  # ahead, with no ratio
            points.append((r.n, None))
        else:
            why.setdefault(got.notes[0] if got.notes else got.text, []).append(r.n)
    return points, busy, why


TITLE = "Efficiency length: the shortest n at which each mechanism beats the baseline"
LEGEND = (
    "≈: interpolated between the two swept n on either side (log n against log ratio), not "
    "measured there; ≤: ahead already at the smallest n compared; >: not ahead at any n "
    "compared (the largest given); a–b: crossed between two swept n where no ratio can be "
    f"interpolated (the baseline did not fit one sequence); {SKIPPED}: no n at which both "
    f"have a figure (its note says why); {MISSING}: no such pair (the baseline itself, or no "
    "row of that baseline at the mechanism's setting)."
)


HEADS = {"time": "faster than {}", "memory": "larger max batch than {}"}


def grid(
    lengths: list[Length],
    *,
    title: str = TITLE,
    heads: dict[str, str] = HEADS,
    behind: str = "",
    legend: tuple[str, ...] = (),
) -> Grid:
    """The one table every format prints: a row per mechanism, a column per (kind,
    baseline), headed ``heads[kind]`` with the baseline's name; with ``behind`` (a heading
    of the same form), a column per baseline of the n at which the mechanism's max batch
    is under the baseline's before it is ahead. Plain text, each writer escapes it for its
    format; ``legend`` adds notes under the table's own."""
    cols = list(dict.fromkeys((x.kind, x.baseline) for x in lengths))
    if behind:
        cols += [("behind", base) for kind, base in cols if kind == "memory"]
    names = list(dict.fromkeys(x.mechanism for x in lengths))
    at = {(x.mechanism, x.kind, x.baseline): x for x in lengths}
    head = ["mechanism"] + [
        (behind if kind == "behind" else heads[kind]).format(base) for kind, base in cols
    ]
    notes: list[str] = []
    body = []
    for mech in names:
        cells = [mech]
        for kind, base in cols:
            if kind == "behind":
                x = at.get((mech, "memory", base))
                cells.append("" if x is None else ", ".join(map(str, x.behind)))
                continue
            x = at.get((mech, kind, base))
            text = MISSING if x is None else x.text
            if x is not None and x.note:
                notes.append(f"({len(notes) + 1}) {mech}, {kind} against {base}: {x.note}")
                text += f" ({len(notes)})"
            cells.append(text)
        body.append(cells)
    return Grid(title, head, body, [LEGEND, *legend, *notes])
