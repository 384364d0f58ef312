"""Recall beside memory: the report's tables for ``task=mqar`` rows (issue #24), pure
functions of rows like :mod:`attnbench.report.quality`.

A *configuration* is a mechanism with its own parameters (:func:`~attnbench.report.ratio.
label`), its budget (the row's ``k`` named by its ``budget``: Linformer's ``k``, Performer's
``nb_features``, local's ``window``, Nyströmformer's ``num_landmarks``; vanilla none) and,
where the rows train with more than one, its short convolution (``short_conv=0``: a
configuration of its own). A *setup* (n, model and every ``quality.mqar`` setting but
``num_kv_pairs``, ``seed`` and ``short_conv``) makes one of each table: the accuracy
(:func:`accuracy_tables`: columns ``num_kv_pairs``, mean ± sd over seeds), the cost beside it
(:func:`cost_tables`) and the seed spread (:func:`seed_tables`); :func:`setups` gives the same
points to the recall–memory Pareto plot (:func:`attnbench.report.quality_plots.mqar_pareto`).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from attnbench.report.grid import Grid
from attnbench.report.quality import task_rows
from attnbench.report.ratio import label
from attnbench.row import Row

TASK = "mqar"
# settings that are not the setup: a column, the seeds averaged, a configuration's own
APART = ("num_kv_pairs", "seed", "short_conv")
ZOOLOGY = (
    "Context, not a target: Zoology (Arora et al. 2023) finds attention solves MQAR at small "
    "width where gated convolutions need a width that grows with the pairs; Based (Arora et "
    "al. 2024, Figure 2) finds recall traded against state size: mechanisms with a fixed-size "
    "state (sliding window, linear attention's feature maps, ...) recall more as it grows, "
    "and attention, whose cache grows with n, recalls best."
)


def settings(r: Row) -> dict[str, Any]:
    """The row's ``quality.mqar`` settings as its cell stored them (defaults included)."""
    return dict((r.cell or {}).get("quality") or ())


def num_pairs(r: Row) -> int:
    """The row's ``num_kv_pairs``; 1/chance where its cell is not stored."""
    got = settings(r).get("num_kv_pairs")
    return int(got) if got is not None else round(1 / r.quality["chance"])


def seed(r: Row) -> int:
    return settings(r).get("seed", 0)  # 0: the task's default


def short_conv(r: Row) -> int | None:
    """The short convolution's kernel the row trained with (0: none)."""
    got = r.quality.get("short_conv")
    return got if got is not None else settings(r).get("short_conv")


def budget(r: Row) -> tuple[str, int]:
    """(``k=64``, 64), (``window=16``, 16) ...; ("", 0) without one. A budget set among the
    mechanism's parameters (``attention=linformer_k256``) is in its label already: ("", 256)."""
    if r.k is not None:
        return f"{r.budget or 'k'}={r.k}", r.k
    return "", (r.params or {}).get(r.budget or "", 0)


def _setup(r: Row) -> tuple[tuple[str, Any], ...]:
    """What a row's training was but for its pairs, seed and short convolution."""
    model = {f"model.{k}": v for k, v in (r.model or {}).items()}
    rest = {k: json.dumps(v) if isinstance(v, (list, tuple)) else v for k, v in settings(r).items()}
    rest = {k: v for k, v in rest.items() if k not in APART}
    return tuple(sorted({"n": r.n, **model, **rest}.items()))


@dataclass(frozen=True)
class Point:
    """One configuration at one ``num_kv_pairs``: its rows, one per seed."""

    config: str  # the table's row: mechanism, budget, short_conv where it differs
    mechanism: str  # the mechanism with its own parameters (a plot's colour)
    budget: int  # the budget's value, 0 without one (the order within a mechanism)
    variant: bool  # trained with a short_conv other than the setup's usual one
    pairs: int
    runs: dict[int, Row]  # seed -> row

    @property
    def accuracies(self) -> list[float]:
        """Test accuracy (%) per seed, in seed order."""
        return [100 * self.runs[s].quality["test_accuracy"] for s in sorted(self.runs)]

    @property
    def mean(self) -> float:  # over seeds
        return statistics.fmean(self.accuracies)

    @property
    def sd(self) -> float | None:
        """The sample standard deviation over seeds; None for one seed."""
        acc = self.accuracies
        return statistics.stdev(acc) if len(acc) > 1 else None

    def figure(self, name: str) -> Any:
        """The first seed's figure (context memory and causal are every seed's)."""
        return self.runs[min(self.runs)].quality.get(name)

    def mean_of(self, name: str, per: Callable[[float], float] = float) -> float | None:
        """The mean over seeds of ``per`` of a figure (None where no seed has it, or 0)."""
        got = [per(v) for r in self.runs.values() if (v := r.quality.get(name))]
        return statistics.fmean(got) if got else None


@dataclass(frozen=True)
class Setup:
    """The rows of one setup: its settings, its points, the setup's usual short_conv."""

    title: str  # what the setup is: n, V, and what tells it apart from another
    rows: list[Row]
    points: list[Point]  # by configuration (table order), then pairs
    short_conv: int | None
    repeated: int  # rows of a configuration, pairs and seed already seen (counted once)

    @property
    def configs(self) -> list[str]:
        return list(dict.fromkeys(p.config for p in self.points))

    @property
    def pairs(self) -> list[int]:
        return sorted({p.pairs for p in self.points})

    def at(self, config: str, pairs: int) -> Point | None:
        return next((p for p in self.points if p.config == config and p.pairs == pairs), None)

    def chance(self, pairs: int) -> float | None:
        return next((r.quality.get("chance") for r in self.rows if num_pairs(r) == pairs), None)


def setups(rows: Iterable[Row | dict[str, Any]]) -> list[Setup]:
    """The ``task=mqar`` rows (status ok), a :class:`Setup` per training setup."""
    mine = task_rows(rows, TASK)
    groups: dict[tuple, list[Row]] = {}
    for r in mine:
        groups.setdefault(_setup(r), []).append(r)
    keys = list(groups)
    return [_make(groups[key], _title(key, keys)) for key in keys]


def _title(key: tuple, keys: list[tuple]) -> str:
    """``n=256, V=2048``, and the settings that tell this setup apart from another."""
    s = dict(key)
    title = f"n={s['n']}, V={s.get('vocab_size', '?')}"
    differ = {k for other in keys for k, v in other if (k, v) not in key} - {"n", "vocab_size"}
    if differ:
        title += " (" + ", ".join(f"{k}={v}" for k, v in key if k in differ) + ")"
    return title


def _make(rows: list[Row], title: str) -> Setup:
    counts = Counter(short_conv(r) for r in rows)
    # the setup's usual kernel: the most rows', the larger where as many (on, by default)
    usual = max(counts, key=lambda s: (counts[s], -1 if s is None else s))
    order = {m: i for i, m in enumerate(dict.fromkeys(label(r) for r in rows))}
    runs: dict[tuple[str, int], dict[int, Row]] = {}
    meta: dict[str, tuple[str, int, bool]] = {}
    repeated = 0
    for r in rows:
        variant = short_conv(r) != usual
        words = (label(r), budget(r)[0], f"short_conv={short_conv(r)}" if variant else "")
        config = " ".join(x for x in words if x)
        meta[config] = (label(r), budget(r)[1], variant)
        seeds = runs.setdefault((config, num_pairs(r)), {})
        if seed(r) in seeds:
            repeated += 1  # training is seeded: the same measurement again
            continue
        seeds[seed(r)] = r

    def place(item: tuple[tuple[str, int], dict[int, Row]]) -> tuple:
        """Mechanisms in the rows' order; the usual short_conv first; budgets ascending."""
        (config, p), _ = item
        mechanism, value, variant = meta[config]
        return order[mechanism], variant, value, config, p

    points = [Point(c, *meta[c], p, seeds) for (c, p), seeds in sorted(runs.items(), key=place)]
    return Setup(title, rows, points, usual, repeated)


def _accuracy(p: Point | None) -> str:
    if p is None or p.sd is None:
        return "-" if p is None else f"{p.mean:.1f} %"
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
        chance = ("-" if (c := s.chance(p)) is None else f"{100 * c:.1f} %" for p in s.pairs)
        body.append(["chance (1/pairs)", "", *chance])
        first = settings(s.rows[0])
        model = ", ".join(f"{k} {v}" for k, v in (s.rows[0].model or {}).items())
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
                    "–" if ms is None else f"{ms:.1f}{at}",
                    "–" if peak is None else f"{peak / 2**20:.1f} MiB{at}",
                    "–" if nbytes is None else f"{nbytes:,} B",
                    "–" if elements is None else f"{elements:,}",
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
