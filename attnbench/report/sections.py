"""What a report holds: the built-in documents and sections, each declared once.

A :class:`~attnbench.report.outline.Section` names itself, says which rows it applies to and
makes its parts from them: grids of text, ratio tables, the paper beside a ratio table, or
figures. The writers of :mod:`attnbench.report.files` only iterate over the registered
sections (:func:`attnbench.report.outline.sections`: these, then a plugin's) and print each
part in their format, so a new table or figure is one entry here, in every format at once;
and ``report.json`` holds what each section records, under the section's ``record`` key.

Tables go into a document (:data:`DOCUMENTS`, declared here beside its sections: its intro
and its ``report.json`` keys), the Markdown and LaTeX file named after what it holds:
``table3`` (Table 3's ratios against the baseline, and the efficiency lengths read from
them), ``serving`` (decode rows: the serving tables of :mod:`attnbench.report.serving`,
the state and bandwidth grids of :mod:`attnbench.report.serving_state`), ``compiled`` (eager
and compiled side by side, flex beside local: :mod:`attnbench.report.compiled`, the peaks
:mod:`attnbench.report.compiled_memory`'s, only where a row is compiled or flex) or
``quality`` (the quality tasks' tables; MQAR's: :mod:`attnbench.report.recall`). Figures go
to ``plots/`` and the page.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from attnbench import registry
from attnbench.report import (
    compiled,
    compiled_memory,
    compiled_plots,
    efficiency,
    flex,
    models,
    packed,
    plots,
    quality,
    quality_plots,
    ratio,
    recall,
    serving,
    serving_plots,
    serving_state,
)
from attnbench.report.grid import Grid
from attnbench.report.outline import Basis, Document, Part, Section, register_builtins
from attnbench.report.paper import beside, load_paper
from attnbench.report.tables import RatioTable
from attnbench.row import Row

TABLE3 = "table3"
SERVING = "serving"
QUALITY = "quality"
COMPILED = "compiled"
PACKED = "packed"
MODELS = "models"


# in the order report.json has always had their keys; the first two's are there even empty
DOCUMENTS = (
    Document(TABLE3, " Time ratio = {0} time per sequence / mechanism's; memory ratio = "
             "mechanism max batch / {0}'s; each model at its own max batch (Linformer paper, "
             "section 5.3).", ("tables", "efficiency_lengths"), always=True, title="Table 3"),
    Document(QUALITY, " Quality rows: no time or memory ratios.", ("quality",), always=True,
             title="Quality"),
    Document(SERVING, " Serving (mode=decode): time-per-token ratio = {0}'s time per "
             "generated token per sequence / the configuration's, at the same fixed batch; "
             "max-batch ratio = the configuration's max batch / {0}'s; {0} with every head's "
             "cache and the same state dtype is each configuration's baseline.",
             ("serving_tables", "serving_efficiency_lengths", "serving_state"),
             title="Serving"),
    Document(COMPILED, " Compiled cells (compile=true: torch.compile of each encoder layer) "
             "beside eager ones: speed-up from compiling = eager time per sequence / compiled, "
             "at the same n, dtype, preset, batch and work; a compiled mechanism's ratios are "
             "against {0} compiled the same way, never the eager one; flex compiles its own "
             "kernel even in the eager model.", ("compiled",), title="Eager and compiled"),
    Document(PACKED, " Variable lengths (mode=packed, packed_train): one draw of documents "
             "padded, packed and bucketed, each time per real token; {0} padded is each "
             "table's baseline.", ("packed_tables",), title="Variable lengths"),
    Document(MODELS, " Named models (arch=) decoding, each against its twin (a model named "
             "X_twin: every layer full attention).", ("models",), title="Models as served"),
)  # fmt: skip


def cost_row(r: Row) -> bool:
    """A row of Table 3's sections: a cost row of a workload other than serving's (decode
    rows have sections of their own). The one statement of the rule: the ratio tables
    (:func:`attnbench.report.files.build`) are made of these rows too."""
    return r.task == "cost" and not serving.applies(r) and not models.applies(r)


def _causal(r: Row) -> bool:
    return cost_row(r) and bool((r.params or {}).get("causal"))


def _task(name: str) -> Callable[[Row], bool]:
    return lambda r: r.task == name


def _lengths(basis: Basis) -> list[Part]:
    lengths = efficiency.efficiency_lengths(basis.rows, dict.fromkeys((basis.baseline, "sdpa")))
    if not lengths:
        return []
    records = tuple(dataclasses.asdict(x) for x in lengths)
    legend = (COMPILED_LENGTHS,) if any(map(ratio.compiled, basis.rows)) else ()
    grid = efficiency.grid(lengths, legend=legend)
    return [Part(grid.title, grid, records)]


COMPILED_LENGTHS = (
    "A compiled mechanism (its name says compiled) against the baseline compiled the same "
    "way, never against the eager one."
)


def _grids(
    make: Callable[[list[Row]], Any], baseline: bool = False
) -> Callable[[Basis], list[Part]]:
    """Parts of a function that makes one grid, a list of them or None (``baseline``: it
    takes the report's baseline too)."""

    def parts(basis: Basis) -> list[Part]:
        made = make(basis.rows, basis.baseline) if baseline else make(basis.rows)
        grids = made if isinstance(made, list) else [] if made is None else [made]
        return [Part(g.title, g, (dataclasses.asdict(g),)) for g in grids]

    return parts


def record(t: RatioTable) -> dict[str, Any]:
    """A ratio table as ``report.json`` holds it: every cell's text and value."""
    return {
        "mechanism": t.mechanism,
        "kind": t.kind,
        "column": t.column,
        "cells": [
            {"n": n, "k": k, "text": t.text[(n, k)], "value": t.value[(n, k)]}
            for n in t.ns
            for k in t.ks
        ],
        "footnotes": list(t.footnotes),
        "context": t.context,
    }


def _ratios(basis: Basis) -> list[Part]:
    return [
        Part(f"{t.kind} ratio: {t.mechanism}", t, (record(t),), stem) for t, stem in basis.tables
    ]


def _serving_ratios(basis: Basis) -> list[Part]:
    """Serving's ratio tables, each with a CSV stem no Table 3 table has."""
    used = {(stem, t.kind) for t, stem in basis.tables}
    out = []
    for t, stem in serving.serving_tables(basis.rows, basis.baseline):
        stem = slug_free(stem, t.kind, used)
        out.append(Part(f"{t.kind} ratio: {t.mechanism}", t, (record(t),), stem))
    return out


def slug_free(stem: str, kind: str, used: set[tuple[str, str]]) -> str:
    """``stem``, or ``stem-2`` ...: the first not yet ``used`` for ``kind``."""
    name, i = stem, 1
    while (name, kind) in used:
        i += 1
        name = f"{stem}-{i}"
    used.add((name, kind))
    return name


def _serving_lengths(basis: Basis) -> list[Part]:
    grids = [
        (serving.lengths_table(lengths, words), tuple(dataclasses.asdict(x) for x in lengths))
        for words, lengths in serving.serving_lengths(basis.rows, basis.baseline)
    ]
    return [Part(g.title, g, records) for g, records in grids]


def _paper(basis: Basis) -> list[Part]:
    paper = load_paper()
    out = []
    for t, _ in basis.tables:
        if (b := beside(t, paper)) is not None:
            out.append(Part(f"{t.kind} ratio beside the paper: {t.mechanism}", b))
    return out


def _figure(
    make: Callable[[list[Row]], Any], stem: str = "", caption: str = ""
) -> Callable[[Basis], list[Part]]:
    """Parts of a function that draws one figure (``stem``, ``caption``), or a list of
    :class:`~attnbench.report.plots.Plot`; nothing where it drew nothing."""

    def parts(basis: Basis) -> list[Part]:
        made = make(basis.rows)
        drawn = made if isinstance(made, list) else [plots.Plot(stem, made, caption)]
        return [Part("plots", p) for p in drawn if p.figure is not None]

    return parts


def _packed_tables(rows: list[Row]) -> list[Grid]:
    """The packed tables, with what the registry says of packing (no row holds it)."""
    return packed.layout_tables(rows, packed.Packs(*registry.packing()))


def _speedups(basis: Basis) -> list[Part]:
    return [
        Part("plots", plots.Plot(f"speedup-{stem}", fig, f"Speed-up over n x k: {t.mechanism}."))
        for t, stem in basis.tables
        if t.kind == "time" and (fig := plots.speedup_heatmap(t)) is not None
    ]


CAUSAL = " Causal (masked) attention."


TIME = "Time per sequence against n (log-log), one line per mechanism and k."
BATCH = "Maximum batch size under the ceiling against n."

# in the order every format shows them; causal rows get figures of their own (one figure of
# every mechanism twice is unreadable)
SECTIONS = (
    Section("efficiency", efficiency.TITLE, cost_row, _lengths, TABLE3, "efficiency_lengths"),
    Section("approx", "Approximation error", _task("approx"), _grids(quality.approx_tables),
            QUALITY, "quality"),
    Section("spectrum", "Spectrum of P", _task("spectrum"), _grids(quality.spectrum_tables),
            QUALITY, "quality"),
    Section("listops", "ListOps accuracy", _task("listops"), _grids(quality.listops_table),
            QUALITY, "quality"),
    Section("listops-seeds", "ListOps accuracy over seeds", _task("listops"),
            _grids(quality.listops_seeds_table), QUALITY, "quality"),
    Section("mqar", "MQAR accuracy", _task("mqar"), _grids(recall.accuracy_tables), QUALITY,
            "quality"),
    Section("mqar-cost", "MQAR cost beside recall", _task("mqar"), _grids(recall.cost_tables),
            QUALITY, "quality"),
    Section("mqar-seeds", "MQAR accuracy over seeds", _task("mqar"),
            _grids(recall.seed_tables), QUALITY, "quality"),
    Section("ratios", "Time and memory ratios against the baseline", cost_row, _ratios, TABLE3,
            "tables"),
    Section("serving", "Serving: time-per-token and max-batch ratios against the baseline",
            serving.applies, _serving_ratios, SERVING, "serving_tables"),
    Section("serving-efficiency", "Serving: efficiency lengths", serving.applies, _serving_lengths,
            SERVING, "serving_efficiency_lengths"),
    Section("serving-state", "Serving: state per sequence and achieved bandwidth", serving.applies,
            _grids(serving_state.state_grids), SERVING, "serving_state"),
    Section("models", "Models as served: sequences that fit, time per token, cache by kind",
            models.applies, _grids(models.grids), MODELS, "models"),
    Section("compiled", "Eager and compiled side by side", compiled.applies,
            _grids(compiled.side_by_side), COMPILED, "compiled", compiled.wanted),
    Section("compiled-short-n", "The short-n end: where compiling pays", compiled.applies,
            _grids(compiled.short_n), COMPILED, "compiled", compiled.wanted),
    Section("compiled-efficiency", "Efficiency lengths of compiled mechanisms",
            compiled.applies, _grids(compiled.compiled_lengths, baseline=True), COMPILED,
            "compiled", compiled.wanted),
    Section("flex-vs-local", "flex beside local at the same window", compiled.applies,
            _grids(flex.flex_beside_local), COMPILED, "compiled", compiled.wanted),
    Section("compiled-memory", "Peak memory, eager and compiled (CPU profiler)",
            compiled.applies, _grids(compiled_memory.memory), COMPILED, "compiled",
            compiled.wanted),
    Section("packed", "Variable lengths: padded, packed and bucketed", packed.applies,
            _grids(_packed_tables), PACKED, "packed_tables"),
    Section("packed-waste", "Variable lengths: padding's waste against packing's speed-up",
            packed.applies, _figure(packed.waste_against_speedup)),
    Section("paper", "The ratios beside the paper's Table 3", cost_row, _paper, TABLE3),
    Section("time-vs-n", TIME, lambda r: cost_row(r) and not _causal(r),
            _figure(plots.time_vs_n, "time-vs-n", TIME)),
    Section("batch-vs-n", BATCH, lambda r: cost_row(r) and not _causal(r),
            _figure(plots.batch_vs_n, "batch-vs-n", BATCH)),
    Section("time-vs-n-causal", TIME + CAUSAL, _causal,
            _figure(plots.time_vs_n, "time-vs-n-causal", TIME + CAUSAL)),
    Section("batch-vs-n-causal", BATCH + CAUSAL, _causal,
            _figure(plots.batch_vs_n, "batch-vs-n-causal", BATCH + CAUSAL)),
    Section("memory-modeled-vs-measured", "The memory model against the device",
            lambda r: True, _figure(
                plots.modeled_vs_measured, "memory-modeled-vs-measured",
                "Max batch predicted by the memory model against the one measured on the "
                "device.",
            )),
    Section("speedup", "Speed-up heat maps", cost_row, _speedups),
    Section("serving-time-vs-n", "Serving: time per token against n", serving.applies,
            _figure(serving_plots.time_per_token)),
    Section("serving-state-vs-n", "Serving: state per sequence against n", serving.applies,
            _figure(serving_plots.state_per_sequence)),
    Section("serving-batch-vs-n", "Serving: max batch against n", serving.applies,
            _figure(serving_plots.max_batch)),
    Section("compiled-time-vs-n", compiled_plots.CAPTION, compiled.applies,
            _figure(compiled_plots.time_vs_n), wanted=compiled.wanted),
    Section("approx-vs-budget", "Approximation error against the budget", _task("approx"),
            _figure(quality_plots.approx_vs_budget)),
    Section("spectrum-figures", "Figure 1: the spectrum of P", _task("spectrum"),
            _figure(quality_plots.spectrum_figures)),
    Section("pareto", "Quality against cost", lambda r: True,
            _figure(quality_plots.pareto_figures)),
    Section("mqar-pareto", "MQAR recall against context memory", _task("mqar"),
            _figure(quality_plots.mqar_pareto)),
)  # fmt: skip

register_builtins(DOCUMENTS, SECTIONS)
