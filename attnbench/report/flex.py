"""Flex beside local: FlexAttention (``flex``, its kernel compiled whatever ``compile``
says) against our blocked sliding window (``local``) at the same window (k: the same band)
and n, each in the eager model and compiled, and flex's time ÷ local's by the one ratio rule
(:func:`attnbench.report.ratio.ratio`, flex as the baseline: > 1, local is faster). Pure
functions of rows, a section of the compiled document (:mod:`attnbench.report.compiled`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnbench import registry
from attnbench.report.compiled import FLEX, LOCAL, Marks, against, applies, ms, where
from attnbench.report.grid import Grid
from attnbench.report.marks import MISSING
from attnbench.report.ratio import compiled, eager, group, name, setting, unnamed
from attnbench.report.tables import context, marked
from attnbench.row import Row, as_rows, printable


def flex_beside_local(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per flex configuration, setting and compile mode: flex beside local at the same
    window (k) and n, each eager and compiled, and flex's time ÷ local's."""
    rows = [r for r in as_rows(rows) if applies(r) and r.attention in (FLEX, LOCAL)]
    flex = [r for r in rows if r.attention == FLEX and window(r) is not None]
    at: dict[tuple, Row] = {}  # flex by its name (its pattern's), local by its own
    for r in rows:
        who = name(eager(r)) if r.attention == FLEX else LOCAL
        at.setdefault((who, compiled(r), window(r), group(eager(r))), r)
    tables: dict[tuple, dict[tuple, None]] = {}
    for r in flex:
        modes = {compiled(x) for x in rows if compiled(x) and unnamed(x) == unnamed(r)}
        for c in sorted(modes) or ["compiled"]:
            key = (name(eager(r)), setting(eager(r)), c)
            tables.setdefault(key, {})[(window(r), group(eager(r)))] = None
    out = []
    for (mech, _, c), keys in tables.items():
        mark, body = Marks(), []
        for k, g in sorted(keys, key=lambda x: (x[0], x[1][0], str(x))):
            le, lc = at.get((LOCAL, None, k, g)), at.get((LOCAL, c, k, g))
            fe, fc = at.get((mech, None, k, g)), at.get((mech, c, k, g))
            words = ("flex", "local")
            one = against(le, fe, mark, words)[0] if le is not None else MISSING
            two = MISSING
            if lc is not None:
                two = against(lc, fc or fe, mark, words)[0]
                if fc is None and fe is not None:
                    why = f"against flex in the eager model (its kernel compiled): no flex {c} row"
                    two = marked(two, mark(why))
            body.append([str(k), str(g[0]), ms(le), ms(lc), ms(fe), ms(fc), one, two])
        first = next(r for r in flex if name(eager(r)) == mech)
        out.append(
            Grid(
                f"{printable(mech)} beside local at the same window: {where(first)}",
                [h.format(c) for h in HEAD],
                body,
                [FLEX_NOTE.format(c), *mark.lines(), context([first, *rows])],
            )
        )
    return out


def window(row: Row) -> int | None:
    """The band's width w: the row's k, else the window among its parameters, else the
    mechanism's default (a sweep with k unset runs each at its own: 256 for both); None for
    flex without the window pattern (full, causal: no band to set beside local's)."""
    params = row.params or {}
    if row.attention == FLEX and params.get("pattern", "full") != "window":
        return None
    if row.k is not None:
        return row.k
    return params.get("window", registry.info(row.attention).params.get("window"))


HEAD = ("window", "n", "local (ms)", "local {} (ms)", "flex (ms)", "flex {} (ms)", "flex ÷ local",
        "flex ÷ local, {}")  # fmt: skip
FLEX_NOTE = (
    "Time per sequence (ms) at the same window (k: local's band |i−j| ≤ k/2, causal the k "
    "keys up to i, flex's block mask the same) and n; flex compiles its kernel even in the "
    "eager model; flex ÷ local: flex's time over local's (> 1: local is faster), both "
    "eager models, and both {0}. busy: timed on a contended CPU, no figure."
)
