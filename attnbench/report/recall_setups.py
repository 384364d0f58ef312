"""MQAR's rows grouped once for every table and plot of them (:mod:`attnbench.report.recall`,
:func:`attnbench.report.quality_plots.mqar_pareto`), a pure function of rows.

A *setup* (n, model and every ``quality.mqar`` setting but ``num_kv_pairs``, ``seed`` and
``short_conv``) is a :class:`Setup`; in it a *configuration* (a mechanism with its own
parameters, its budget and, where the rows train with more than one, its short convolution;
a layer schedule, a hybrid's, named by its layers: :func:`mechanism`) at one
``num_kv_pairs`` is a :class:`Point`, its rows one per seed. A hybrid is a configuration,
not a setup: its layers, width and training are its mechanisms' own pure models', beside
which it is read. A row stored twice (the
same setup and seed) is counted once: training is seeded, so it is the same measurement.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from attnbench.cell import label as mechanism_label
from attnbench.report.quality import task_rows
from attnbench.report.ratio import label
from attnbench.row import Row
from attnbench.schedule import OWN, tiled

TASK = "mqar"
# settings that are not the setup: a column, the seeds averaged, a configuration's own
APART = ("num_kv_pairs", "seed", "short_conv")
# the model's keys that are a configuration's (its label's), not the setup's
OWN_MODEL = ("schedule",)


def shape(r: Row) -> dict[str, Any]:
    """The row's model but what its configuration says (:data:`OWN_MODEL`): the setup's."""
    return {k: v for k, v in (r.model or {}).items() if k not in OWN_MODEL}


def scheduled(r: Row) -> bool:
    """Whether the row's model is a layer schedule (a hybrid)."""
    return bool((r.model or {}).get("schedule"))


def mechanism(r: Row) -> str:
    """The row's mechanism with its own parameters (:func:`~attnbench.report.ratio.label`);
    a layer schedule's, its layers' in order joined by ``+`` (``gated_deltanet+vanilla``),
    each with the parameters and heads its kind declares: what each layer ran, to be read
    beside those mechanisms' own rows, in a name a table's row and a quote can hold (the
    canonical schedule, ``mixer, attention; ...``, has commas). From the stored cell's
    ``schedule`` and ``kinds``; a row without them keeps :func:`label`."""
    spec = r.cell or {}
    if not scheduled(r) or not isinstance(spec.get("schedule"), str):
        return label(r)
    kinds = spec.get("kinds") or {}
    names = tiled(spec["schedule"], int(spec.get("layers") or (r.model or {})["layers"]))

    def one(name: str) -> str:
        if name == OWN:
            return mechanism_label(r.attention, r.params)
        kind = dict(kinds[name])
        own = {k: v for k, v in kind.items() if k not in ("attention", "params")}
        return mechanism_label(kind["attention"], {**(kind.get("params") or {}), **own})

    return "+".join(one(name) for name in names)


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
    model = {f"model.{k}": v for k, v in shape(r).items()}
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
    order = {m: i for i, m in enumerate(dict.fromkeys(mechanism(r) for r in rows))}
    runs: dict[tuple[str, int], dict[int, Row]] = {}
    meta: dict[str, tuple[str, int, bool]] = {}
    repeated = 0
    for r in rows:
        variant = short_conv(r) != usual
        words = (mechanism(r), budget(r)[0], f"short_conv={short_conv(r)}" if variant else "")
        config = " ".join(x for x in words if x)
        meta[config] = (mechanism(r), budget(r)[1], variant)
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
