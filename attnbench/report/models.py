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
    " 24x it). Weights are the dense stand-in of the active size: a real MoE holds every"
    " expert and fits fewer sequences; a model and its twin hold the same weights."
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


def _groups(rows: list[Row]) -> dict[tuple[str, str, Any], list[Row]]:
    """The rows by preset device, dtype and batch asked (``max`` or a number)."""
    out: dict[tuple[str, str, Any], list[Row]] = {}
    for r in rows:
        out.setdefault((r.device, r.dtype, r.batch_asked), []).append(r)
    return out


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
    at = {(r.n, name(r)): figure(r) for r in rows if r.status == "ok"}
    oom = {(r.n, name(r)) for r in rows if r.status == "oom"}
    models = sorted({m for _, m in (*at, *oom) if m and not m.endswith(TWIN)})
    if not models or all(v is None for v in at.values()):
        return None
    twinned = {m.removesuffix(TWIN) for _, m in (*at, *oom) if m and m.endswith(TWIN)}
    body = []
    for n in sorted({n for n, _ in (*at, *oom)}):
        line = [context_label(n)]
        for m in models:
            mine, twin = at.get((n, m)), at.get((n, m + TWIN))
            cell = OOM if (n, m) in oom else MISSING if mine is None else show(mine)
            if mine is not None and twin:
                cell += f" ({sig(ratio(mine, twin))}x)"
            elif mine is not None and m in twinned:  # the twin did not fit here
                cell += f" (twin: {OOM if (n, m + TWIN) in oom else MISSING})"
            line.append(cell)
        body.append(line)
    head = ["context", *(printable(m) for m in models)]
    return Grid(title, head, body, [*notes, ABSENT])


def _per_token_at_one(r: Row) -> float | None:
    """Batch 1's time per token from the same row: one sequence's state and the weights, a
    b-th of the FLOPs (a step's FLOPs are linear in b), through the same roofline."""
    s = r.modeled_step
    if not s:
        return None
    one = s["weight_bytes"] + s["state_read_bytes"] / s["batch"]
    flops = s.get("flops", 0) / s["batch"]
    return roofline(one, flops, s["bandwidth_bytes_per_s"], s.get("peak_flops_per_s"))["step_s"]


def fit_and_time(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per preset device and dtype: the sequences that fit and the time per token (modeled
    at the max batch and at batch 1; measured where a step was timed), each against the
    twin."""
    out = []
    for (device, dtype, asked), here in sorted(_groups(as_rows(rows)).items(), key=str):
        where = f"{printable(device)}, {dtype}"  # a fixed batch's time: no ceiling said
        if asked == "max" and isinstance(ceiling := here[0].ceiling_bytes, int):
            where += f", ceiling {ceiling / 2**30:.1f} GiB"
        speedup = [RATIO.format("twin's time ÷ the model's: above 1, the model is faster")]
        tables = []
        if asked == "max":
            tables += [
                _table(here, f"Sequences that fit, {where}", lambda r: r.max_batch,
                       lambda v: str(int(v)), lambda a, b: a / b,
                       [RATIO.format("the model's ÷ the twin's")]),
                _table(here, f"Time per token at the max batch, modeled, {where}",
                       lambda r: (r.modeled_step or {}).get("per_token_s"), _ms,
                       lambda a, b: b / a, [*speedup, BOUND]),
                _table(here, f"Time per token at batch 1, modeled, {where}",
                       _per_token_at_one, _ms, lambda a, b: b / a, [*speedup, BOUND]),
            ]  # fmt: skip
        tables.append(
            _table(here, f"Time per token measured at batch {asked}, {where}",
                   lambda r: r.time_per_seq_s, _ms, lambda a, b: b / a,
                   [*speedup, "Measured on the device the row names (time_device)."])
        )  # fmt: skip
        out += [t for t in tables if t is not None]
    return out


def cache_by_kind(rows: Iterable[Row | dict[str, Any]]) -> Grid | None:
    """One sequence's cache or state in each kind of layer, per model and context (the
    steps' mean context), and its twin's whole: what a schedule keeps, and where."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for r in as_rows(rows):
        if r.status == "ok" and r.modeled_step and name(r):
            found.setdefault((name(r), r.n), r.modeled_step.get("state_by_kind") or {})
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
        "Cache per sequence by layer kind", ["model: kind", *map(context_label, ns)], body,
        ["One sequence's cache or state in the layers of each kind at the timed steps' mean"
         " context; in brackets, against the twin's whole cache there (every layer full"
         " attention).", ABSENT],
    )  # fmt: skip


def grids(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Every table of the section: :func:`fit_and_time`'s, then :func:`cache_by_kind`'s."""
    rows = as_rows(rows)
    cache = cache_by_kind(rows)
    return fit_and_time(rows) + ([] if cache is None else [cache])
