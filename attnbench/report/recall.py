"""Recall beside memory: the report's tables for ``task=mqar`` rows (issue #24), pure
functions of rows like :mod:`attnbench.report.quality`.

A *configuration* is a mechanism with its own parameters (:func:`~attnbench.report.ratio.
label`), its budget (the row's ``k`` named by its ``budget``: Linformer's ``k``, Performer's
``nb_features``, local's ``window``, Nyströmformer's ``num_landmarks``; vanilla none) and,
where the rows train with more than one, its short convolution (``short_conv=0``: a
configuration of its own). A *setup* (n, model and every ``quality.mqar`` setting but
``num_kv_pairs``, ``seed`` and ``short_conv``) makes one of each table: the accuracy
(:func:`accuracy_tables`: columns ``num_kv_pairs``, mean ± sd over seeds), the cost beside it
(:func:`cost_tables`) and the seed spread (:func:`seed_tables`). The grouping is
:mod:`attnbench.report.recall_setups`' (:func:`~attnbench.report.recall_setups.setups`), which
gives the same points to the recall–memory Pareto plot
(:func:`attnbench.report.quality_plots.mqar_pareto`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnbench.report.grid import Grid
from attnbench.report.marks import MISSING, SKIPPED
from attnbench.report.recall_setups import (
    Point,
    Setup,
    scheduled,
    settings,
    setups,
    shape,
    short_conv,
)
from attnbench.row import Row

ZOOLOGY = (
    "Context, not a target: Zoology (Arora et al. 2023) finds attention solves MQAR at small "
    "width where gated convolutions need a width that grows with the pairs; Based (Arora et "
    "al. 2024, Figure 2) finds recall traded against state size: mechanisms with a fixed-size "
    "state (sliding window, linear attention's feature maps, ...) recall more as it grows, "
    "and attention, whose cache grows with n, recalls best."
)


def _accuracy(p: Point | None) -> str:
    if p is None or p.sd is None:
        return MISSING if p is None else f"{p.mean:.1f} %"
    return f"{p.mean:.1f} ± {p.sd:.1f} % ({len(p.runs)} seeds)"


def _trained(s: Setup, config: str) -> str:
    causal = {p.figure("causal") for p in s.points if p.config == config}
    return " / ".join({True: "causal", False: "bidirectional"}.get(c, "?") for c in causal)


def _short_conv(s: Setup) -> str:
    what = f"a short convolution of kernel {s.short_conv}" if s.short_conv else "none"
    mixed = len({short_conv(r) for r in s.rows}) > 1
    return f"Before each layer's attention: {what}" + (", unless the label says." if mixed else ".")


def accuracy_tables(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per setup, test accuracy (%) over query positions: rows configuration, columns
    ``num_kv_pairs``; mean ± sd (seeds) where a configuration ran several seeds."""
    out = []
    for s in setups(rows):
        head = ["configuration", "trained", *(f"{p} pairs" for p in s.pairs)]
        body = [
            [config, _trained(s, config), *(_accuracy(s.at(config, p)) for p in s.pairs)]
            for config in s.configs
        ]
        chance = (MISSING if (c := s.chance(p)) is None else f"{100 * c:.1f} %" for p in s.pairs)
        body.append(["chance (1/pairs)", "", *chance])
        first = settings(s.rows[0])
        model = ", ".join(f"{k} {v}" for k, v in shape(s.rows[0]).items())
        notes = [
            f"Multi-query associative recall generated as Zoology does, n = {s.rows[0].n}, "
            f"vocabulary {first.get('vocab_size')}, model {model}, trained from scratch for "
            f"{first.get('steps')} steps at each learning rate of {first.get('lrs')}, "
            "the best kept (Zoology keeps its best of four); test accuracy over the query "
            "positions. sd: the sample standard deviation over seeds (a seed draws the data "
            "and the initialisation).",
            "trained: causal where the mechanism has a causal form; bidirectional where it has "
            "none (Linformer, Nyströmformer): the answer is never to the right of its query, "
            "so looking right shows only keys and fillers. " + _short_conv(s),
            ZOOLOGY,
        ]
        if s.repeated:
            notes.append(f"{s.repeated} repeated row(s) (the same setup and seed) counted once.")
        out.append(Grid(f"MQAR test accuracy, {s.title}", head, body, notes))
    return out


def cost_tables(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per setup and configuration, beside the accuracy: the time per training step and the
    training peak at the largest ``num_kv_pairs`` the configuration ran (the mean over its
    seeds), and its context memory per layer and sequence."""
    out = []
    for s in setups(rows):
        top = max(s.pairs)
        head = [
            "configuration", "ms / training step", "training peak",
            "context memory / layer (fp32)", "context elements / layer",
        ]  # fmt: skip
        body = []
        for config in s.configs:
            p = max((x for x in s.points if x.config == config), key=lambda x: x.pairs)
            ms = p.mean_of("steps_per_s", lambda v: 1000 / v)
            peak = p.mean_of("peak_bytes")
            at = "" if p.pairs == top else f" (at {p.pairs} pairs)"
            nbytes, elements = p.figure("context_bytes"), p.figure("context_elements")
            body.append(
                [
                    config,
                    SKIPPED if ms is None else f"{ms:.1f}{at}",
                    SKIPPED if peak is None else f"{peak / 2**20:.1f} MiB{at}",
                    SKIPPED if nbytes is None else f"{nbytes:,} B",
                    SKIPPED if elements is None else f"{elements:,}",
                ]
            )
        notes = [
            f"Time per training step (1 / steps per second) and training peak (bytes one "
            f"steady step allocates, CPU profiler) of the learning rate chosen, at the largest "
            f"number of pairs ({top}) unless the cell says otherwise, each the mean over seeds "
            "(of the time per step, not of the rate): the batch, n and vocabulary, and so the "
            "step's work, are the same at every number of pairs.",
            "Context memory: what carries the context for one sequence in one layer, from each "
            "mechanism's one formula (docs/mechanisms.md), fp32 as trained: the K/V cache at n "
            "for exact attention, the window's keys and values for local, the feature state "
            "for linear and Performer, the k projected keys and values for Linformer (context "
            "memory, not a recurrent state), the landmarks for Nyströmformer.",
        ]
        if any(scheduled(r) for r in s.rows):
            notes.append(
                "A layer schedule (its label's schedule=: a hybrid, each layer its kind's "
                "mechanism): the sum of its layers' context memory, each by its own "
                "mechanism's formula, divided by its layers as every row's is, so that it "
                "stands on one axis with the pure models of as many layers."
            )
        out.append(Grid(f"MQAR cost beside recall, {s.title}", head, body, notes))
    return out


def seed_tables(rows: Iterable[Row | dict[str, Any]]) -> list[Grid]:
    """Per setup, each configuration and ``num_kv_pairs`` trained from more than one seed:
    every seed's accuracy, their mean and sample sd. None where no point has two seeds."""
    out = []
    for s in setups(rows):
        many = [p for p in s.points if len(p.runs) > 1]
        if not many:
            continue
        head = ["configuration", "pairs", "seeds", "test accuracy per seed", "mean", "sd"]
        body = [
            [
                p.config,
                str(p.pairs),
                ", ".join(map(str, sorted(p.runs))),
                ", ".join(f"{a:.2f}" for a in p.accuracies) + " %",
                f"{p.mean:.2f} %",
                f"{p.sd:.2f}",
            ]
            for p in many
        ]
        notes = [
            "Test accuracy over training seeds (a seed draws the data and the initialisation); "
            "sd is the sample standard deviation. A difference between configurations smaller "
            "than this spread is not a result."
        ]
        out.append(Grid(f"MQAR accuracy over seeds, {s.title}", head, body, notes))
    return out
