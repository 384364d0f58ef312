"""Models as served (``+sweep=hybrid``, docs/models.md): each named model beside its twin,
pure functions of rows.

A row of a named model (``model.name``, which an ``arch=`` preset sets) decodes; a model
named ``X_twin`` is X's twin, the same model with every layer full attention. The tables
are a grid per preset device and dtype, rows the context, a column per model, each cell the
model's figure and its ratio against its twin at the same context:

* **sequences that fit**: the max batch (the preset's ÷ the twin's);
* **time per token**, modeled (a row's ``modeled_step``, the roofline of
  :mod:`attnbench.measure.roofline`) at the max batch and at batch 1, or measured where the
  row's step was timed (the ``_small`` variants on a CPU): the twin's ÷ the model's, so
  above 1 the model is faster;
* **cache by layer kind**: what one sequence keeps in each kind of layer
  (``modeled_step.state_by_kind``) against the twin's whole cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from attnbench.measure.roofline import roofline
from attnbench.report.grid import Grid, sig
from attnbench.report.marks import MISSING, OOM
from attnbench.report.ratio import draw
from attnbench.row import Row, as_rows, printable

TWIN = "_twin"
MODE = "decode"
ABSENT = (
    f"{MISSING}: no row (the weights and one sequence's cache exceed the ceiling: the sweep"
    f" leaves the cell out) or no such figure; {OOM}: they fit, but not beside one prefill."
)
RATIO = "In brackets: the model's figure against its twin's ({0})."
BOUND = (
    "Modeled: a step's bytes read over the preset's datasheet bandwidth, or its FLOPs over"
    " the peak where longer, a lower bound (results/gpu_check: timed H200 steps took 1.4x to"
    " 24x it). Weights are each model's own, the MLP a dense stand-in of the active size: a"
    " real MoE holds every expert and fits fewer sequences."
)


def name(row: Row) -> str | None:
    """The model's name, as stored (``model.name``), or None."""
    value = (row.model or {}).get("name")
    return value if isinstance(value, str) else None


def applies(row: Row) -> bool:
    """A row of this section: a named model's decode cost row."""
    return row.task == "cost" and row.mode == MODE and name(row) is not None


def context_label(n: int) -> str:
    """``4K``, ``128K``, ``1M``; other contexts as they are."""
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _gib(b: float) -> str:
    return f"{sig(b / 2**30)} GiB" if b >= 2**30 else f"{sig(b / 2**20)} MiB"


def _ms(s: float) -> str:
    return f"{sig(s * 1e3)} ms" if s >= 1e-4 else f"{sig(s * 1e6)} us"


def _groups(rows: list[Row]) -> dict[tuple, list[Row]]:
    """The rows by what a model and its twin must share to be compared: the preset device,
    dtype, ceiling, batch asked (``max`` or a number), decode tokens, the state's dtype and
    the prompts (every one n, or a draw: :func:`attnbench.report.ratio.draw`)."""
    out: dict[tuple, list[Row]] = {}
    for r in rows:
        at = (r.device, r.dtype, r.ceiling_bytes, str(r.batch_asked), r.decode_tokens)
        out.setdefault((*at, r.state_dtype, str(draw(r))), []).append(r)
    return out


def _column(r: Row) -> tuple[str, Any]:
    """A row's model, as a column: its name and prefill chunk (a model prefilled in two
    chunk sizes is two columns, each against its twin in the same)."""
    return (name(r) or "", r.prefill_chunk)


def _table(
    rows: list[Row],
    title: str,
    figure: Callable[[Row], float | None],
    show: Callable[[float], str],
    ratio: Callable[[float, float], float],
    notes: list[str],
) -> Grid | None:
    """Rows the contexts, a column per model (its twin's figures in its brackets), each cell
    ``show(figure)`` and, beside a twin's, ``ratio(model's, twin's)``; a model that does not
    fit, :data:`OOM`; None when no cell has a figure."""
    at = {(r.n, _column(r)): figure(r) for r in rows if r.status == "ok"}
    oom = {(r.n, _column(r)) for r in rows if r.status == "oom"}
    seen = {c for _, c in (*at, *oom)}
    models = sorted(c for c in seen if c[0] and not c[0].endswith(TWIN))
    if not models or all(v is None for v in at.values()):
        return None
    body = []
    for n in sorted({n for n, _ in (*at, *oom)}):
        line = [context_label(n)]
        for m, chunk in models:
            pair = (m + TWIN, chunk)
            mine, twin = at.get((n, (m, chunk))), at.get((n, pair))
            cell = OOM if (n, (m, chunk)) in oom else MISSING if mine is None else show(mine)
            if mine is not None and twin:
                cell += f" ({sig(ratio(mine, twin))}x)"
            elif mine is not None and pair in seen:  # the twin did not fit here
                cell += f" (twin: {OOM if (n, pair) in oom else MISSING})"
            line.append(cell)
        body.append(line)
    twice = {m for m, _ in models if sum(x == m for x, _ in models) > 1}
    head = [printable(m) + (f" (prefill_chunk={c})" if m in twice else "") for m, c in models]
    return Grid(title, ["context", *head], body, [*notes, ABSENT])


def _per_token_at_one(r: Row) -> float | None:
    """Batch 1's time per token from the same row: one sequence's state and the weights, a
    b-th of the FLOPs (a step's FLOPs are linear in b), through the same roofline."""
    s = r.modeled_step
    if not s:
        return None
    one = s["weight_bytes"] + s["state_read_bytes"] / s["batch"]
    flops = s["flops"] / s["batch"]
    return roofline(one, flops, s["bandwidth_bytes_per_s"], s.get("peak_flops_per_s"))["step_s"]


def _weights(rows: list[Row]) -> list[str]:
    """A note of each model's weights as its rows' modeled steps read them: a twin's differ
    from its model's (attention's projections in place of a mixer's), and the difference is
    in every ratio at batch 1 and at the max batch."""
    held = {name(r): r.modeled_step["weight_bytes"] for r in rows if r.modeled_step and name(r)}
    if not held:
        return []
    each = ", ".join(f"{printable(m)} {sig(b / 1e9)}" for m, b in sorted(held.items()))
    return [f"Weights each step reads, GB: {each}."]


def fit_and_time(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per preset device and dtype: the sequences that fit and the time per token (modeled
    at the max batch and at batch 1; measured where a step was timed), each against the
    twin."""
    out = []
    groups = sorted(_groups(as_rows(rows)).items(), key=str)
    for (device, dtype, ceiling, asked, tokens, state, _), here in groups:
        where = f"{printable(device)}, {dtype}"  # a fixed batch's time: no ceiling said
        if asked == "max" and isinstance(ceiling, int):
            where += f", ceiling {ceiling / 2**30:.1f} GiB"
        if sum(g[:4] == (device, dtype, ceiling, asked) for g, _ in groups) > 1:
            where += f", {tokens} decode tokens, state {state}"  # two such groups: apart
        speedup = [RATIO.format("twin's time ÷ the model's: above 1, the model is faster")]
        weights = _weights(here)
        tables = []
        if asked == "max":
            tables += [
                _table(here, f"Sequences that fit, {where}", lambda r: r.max_batch,
                       lambda v: str(int(v)), lambda a, b: a / b,
                       [RATIO.format("the model's ÷ the twin's"), *weights]),
                _table(here, f"Time per token at the max batch, modeled, {where}",
                       lambda r: (r.modeled_step or {}).get("per_token_s"), _ms,
                       lambda a, b: b / a, [*speedup, BOUND, *weights]),
                _table(here, f"Time per token at batch 1, modeled, {where}",
                       _per_token_at_one, _ms, lambda a, b: b / a, [*speedup, BOUND, *weights]),
            ]  # fmt: skip
        tables.append(
            _table(here, f"Time per token measured at batch {asked}, {where}",
                   lambda r: r.time_per_seq_s, _ms, lambda a, b: b / a,
                   [*speedup, "Measured on the device the row names (time_device)."])
        )  # fmt: skip
        out += [t for t in tables if t is not None]
    return out


def cache_by_kind(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """One sequence's cache or state in each kind of layer, per model and context (the
    steps' mean context), and its twin's whole: what a schedule keeps, and where; a grid per
    dtype, state dtype and decode tokens (the bytes differ between them, not by device)."""
    sets: dict[tuple, dict[tuple[str, int], dict[str, Any]]] = {}
    for r in as_rows(rows):
        if r.status == "ok" and r.modeled_step and name(r):
            found = sets.setdefault((r.dtype, r.state_dtype, r.decode_tokens), {})
            found.setdefault((name(r), r.n), r.modeled_step["state_by_kind"])
    grids = []
    for (dtype, state, tokens), found in sorted(sets.items(), key=str):
        title = f"Cache per sequence by layer kind, {dtype}"
        if len(sets) > 1:
            title += f", state {state}, {tokens} decode tokens"
        if (grid := _cache_grid(found, title)) is not None:
            grids.append(grid)
    return grids


def _cache_grid(found: dict[tuple[str, int], dict[str, Any]], title: str) -> Grid | None:
    """Rows each model's kinds, columns the contexts (:func:`cache_by_kind`'s one grid)."""
    models = sorted({m for m, _ in found if not m.endswith(TWIN)})
    ns = sorted({n for _, n in found})
    if not models:
        return None
    body = []
    for m in models:
        kinds = sorted({k for (mm, _), v in found.items() if mm == m for k in v})
        for kind in kinds:
            line, total = [], None
            for n in ns:
                mine = found.get((m, n), {})
                twin = sum(e["bytes"] for e in found.get((m + TWIN, n), {}).values())
                entry = mine.get(kind)
                if entry is None:
                    line.append(MISSING)
                    continue
                total = entry
                share = f" ({entry['bytes'] / twin:.1%} of the twin's)" if twin else ""
                line.append(_gib(entry["bytes"]) + share)
            what = f"{total['mechanism']} x{total['layers']}" if total else ""
            body.append([f"{printable(m)}: {printable(kind)} ({printable(what)})", *line])
    return Grid(
        title, ["model: kind", *map(context_label, ns)], body,
        ["One sequence's cache or state in the layers of each kind at the timed steps' mean"
         " context; in brackets, against the twin's whole cache there (every layer full"
         " attention).", ABSENT],
    )  # fmt: skip


def grids(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Every table of the section: :func:`fit_and_time`'s, then :func:`cache_by_kind`'s."""
    rows = as_rows(rows)
    return fit_and_time(rows) + cache_by_kind(rows)
