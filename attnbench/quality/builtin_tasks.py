"""The built-in quality tasks, each declared as a :class:`Task`: its settings with their
defaults, its figures, its own rules and its run. :mod:`attnbench.quality.tasks` registers
them first and holds the registry a plugin's task joins (``tasks.register``); a plugin
declares its task the same way, from these classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnbench.quality import classify, listops, recall, runs
from attnbench.settings import Setting, defaults
from attnbench.validators import check_choice, check_int

if TYPE_CHECKING:
    from attnbench.cell import Cell

INPUTS = ("random", "listops")


@dataclass(frozen=True)
class Figure:
    """A key of a row's ``quality``; ``kind`` is what its stored value is. Every row of the
    task holds it, of its kind (a report reads it), unless it is ``optional``: absent from
    some rows (``inputs=listops`` only) or null where it is undefined (a mechanism without
    rows has no ``row_error``). ``choices``: the values a text figure may take."""

    name: str
    kind: str  # number | count | text | list | flag | curves (lists of numbers, one a row)
    doc: str
    optional: bool = False
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    name: str
    doc: str
    settings: tuple[Setting, ...]
    figures: tuple[Figure, ...]
    # the task's own rules and run, each given the cell and its resolved settings
    check: Callable[[Cell, dict[str, Any]], None]
    run: Callable[[Cell, dict[str, Any]], dict[str, Any]]
    # True: the task trains every mechanism with a causal form causally whatever the cell's
    # ``causal`` says (MQAR, as Zoology's language models), so a causal-only one is not refused
    trains_causally: bool = False
    # True: a cell may give the model a layer schedule (``model.schedule``), each layer its
    # kind's mechanism (MQAR: a hybrid's recall beside its layers' context memory); a task
    # that compares one mechanism against exact attention layer by layer cannot take one
    schedules: bool = False
    # what a report reads of the figures together (each already of its kind): a ValueError line
    figure_rules: Callable[[dict[str, Any]], None] | None = None
    # the other task whose config block a cell of this one carries with its own settings,
    # given them (approx and spectrum on inputs=listops read task=listops's trained model,
    # so its settings are part of the cell), or None: it carries none
    borrows: Callable[[dict[str, Any]], str | None] | None = None

    def __post_init__(self) -> None:
        owned = tuple(s.owned(f"task={self.name}", f"quality.{self.name}.") for s in self.settings)
        object.__setattr__(self, "settings", owned)

    def defaults(self) -> dict[str, Any]:
        """The settings a cell that names none gets: the config's ``quality.<task>`` block."""
        return defaults(self.settings)


def _check_training(n: int, s: dict[str, Any]) -> None:
    """The settings of a ListOps training run at ``n``, named by their ``quality.listops``
    keys: task=listops's own, or those of the trained model that ``inputs=listops`` reads.
    Checked here, before any cell runs, by the rules the training itself applies
    (:func:`attnbench.quality.classify.check_settings`)."""
    listops.check_n(n)
    classify.check_settings(n, prefix="quality.listops.", **s)


def _check_inputs(task: str, cell: Cell, s: dict[str, Any]) -> None:
    check_choice(f"quality.{task}.inputs", s["inputs"], INPUTS)
    check_int(f"quality.{task}.batch", s["batch"])
    if s["inputs"] == "listops":
        _check_training(cell.n, s["listops"])


def _listops_inputs(s: dict[str, Any]) -> str | None:
    """inputs=listops reads the model task=listops trains, at that task's settings."""
    return "listops" if s.get("inputs") == "listops" else None


def _check_approx(cell: Cell, s: dict[str, Any]) -> None:
    from attnbench.quality.approx import exact_counterpart

    _check_inputs("approx", cell, s)
    exact_counterpart(cell.attention)
    check_int("quality.approx.seeds", s["seeds"])


def _check_spectrum(cell: Cell, s: dict[str, Any]) -> None:
    _check_inputs("spectrum", cell, s)
    if cell.attention != "vanilla":
        raise ValueError(
            f"attention: task=spectrum reads softmax's own P: needs vanilla, got {cell.attention}"
        )
    index = check_int("quality.spectrum.index", s["index"])
    if index > cell.n:
        raise ValueError(f"quality.spectrum.index: must be at most n={cell.n}, got {index}")


def _check_listops(cell: Cell, s: dict[str, Any]) -> None:
    _check_training(cell.n, s)


def _check_mqar(cell: Cell, s: dict[str, Any]) -> None:
    """The data's rules at the cell's n (Zoology's: n even, 4·pairs <= n, vocabulary > n and
    able to hold the keys and values, power_a > 0), then the training's, by the checks the run
    itself applies (:func:`attnbench.quality.recall.check_settings`), and what they make
    grow against this machine's memory (:func:`attnbench.quality.recall.check_fits`)."""
    recall.check_settings(cell.n, prefix="quality.mqar.", **s)
    recall.check_fits(cell.n, cell.model.d_model, prefix="quality.mqar.", **s)


def _spectrum_figures(q: dict[str, Any]) -> None:
    """The spectrum's table reads every layer's curve at ``index`` and a row of heads per
    layer beside it; its figure draws those rows as an image (each as long)."""
    curves, heads, index = q["cumulative"], q["at_index"], q["index"]
    if len(heads) != len(curves) or len({len(h) for h in heads}) != 1:
        raise ValueError(
            f"quality.at_index: must have a row per layer of cumulative ({len(curves)}), "
            f"each of every head, got rows of {[len(h) for h in heads]} values"
        )
    shortest = min(len(c) for c in curves)
    if not 1 <= index <= shortest:
        raise ValueError(f"quality.index: must be in [1, {shortest}] (the curves), got {index}")


_SEED = Setting("seed", 0, "the first seed of the inputs and weights")
_BATCH = Setting("batch", 2, "sequences per measurement")
_LISTOPS = classify.DEFAULTS  # the training's own defaults, as MQAR's are recall.DEFAULTS
_INPUTS = Setting("inputs", "random", "random (fresh seeded layers) or listops (trained states)")
_CARRY = Setting(
    "listops", None, "the trained model's quality.listops settings", dict, carried=True
)
_INPUTS_FIGURE = Figure("inputs", "text", "random or listops", choices=INPUTS)
_TRAINED = Figure(
    "model_accuracy", "number", "inputs=listops: the trained model's accuracy", optional=True
)

BUILTIN_TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "approx",
            "error against exact softmax attention on the same weights",
            (
                _INPUTS,
                _SEED,
                Setting("seeds", 3, "random inputs: seeds averaged"),
                _BATCH,
                _CARRY,
            ),
            (
                _INPUTS_FIGURE,
                Figure("rel_frobenius", "number", "‖Y − Ŷ‖_F / ‖Y‖_F on real positions"),
                Figure("cosine", "number", "mean cosine of y_i and ŷ_i over real tokens"),
                Figure(
                    "row_error",
                    "number",
                    "mean TV distance of implied and softmax rows",
                    optional=True,
                ),
                Figure("uniform_rel_frobenius", "number", "uniform attention's rel_frobenius"),
                Figure(
                    "uniform_row_error", "number", "uniform attention's row_error", optional=True
                ),
                Figure("layers", "list", "inputs=listops: each layer's figures", optional=True),
                _TRAINED,
            ),
            _check_approx,
            runs.approx,
            borrows=_listops_inputs,
        ),
        Task(
            "spectrum",
            "singular values of softmax's P in a vanilla model (paper Figure 1)",
            (_INPUTS, _SEED, _BATCH, Setting("index", 128, "the singular value read"), _CARRY),
            (
                _INPUTS_FIGURE,
                Figure("n", "count", "the sequence length (points per curve)"),
                Figure("index", "count", "the singular value at_index reads"),
                Figure("cumulative", "curves", "per layer: normalised cumulative singular values"),
                Figure("at_index", "curves", "layers × heads: the cumulative value at index"),
                _TRAINED,
            ),
            _check_spectrum,
            runs.spectrum,
            figure_rules=_spectrum_figures,
            borrows=_listops_inputs,
        ),
        Task(
            "listops",
            "ListOps accuracy after a fixed training budget",
            (
                _SEED,
                Setting("steps", _LISTOPS["steps"], "training steps"),
                Setting("batch", _LISTOPS["batch"], "sequences per step"),
                Setting("lr", _LISTOPS["lr"], "AdamW's peak learning rate"),
                Setting("warmup", _LISTOPS["warmup"], "linear warmup steps"),
                Setting("weight_decay", _LISTOPS["weight_decay"], "AdamW's weight decay"),
                Setting("train_examples", _LISTOPS["train_examples"], "expressions trained on"),
                Setting("test_examples", _LISTOPS["test_examples"], "expressions tested on"),
                Setting("max_depth", _LISTOPS["max_depth"], "the deepest an expression nests"),
                Setting("max_args", _LISTOPS["max_args"], "the most arguments an operator takes"),
                Setting("eval_every", _LISTOPS["eval_every"], "steps between points of the curve"),
            ),
            (
                Figure("test_accuracy", "number", "test accuracy after the last step"),
                Figure("majority_accuracy", "number", "what predicting one class scores"),
                Figure("steps_per_s", "number", "training steps per second"),
                Figure("peak_bytes", "count", "bytes one training step allocates"),
                Figure("curve", "list", "[step, test accuracy] every eval_every steps"),
                Figure("train_examples", "count", "expressions trained on"),
                Figure("test_examples", "count", "expressions tested on"),
                Figure("seconds", "number", "the whole training call"),
            ),
            _check_listops,
            runs.listops,
        ),
        Task(
            "mqar",
            "multi-query associative recall (Zoology's MQAR) after a fixed training budget",
            (
                Setting("num_kv_pairs", recall.DEFAULTS["num_kv_pairs"], "key-value pairs"),
                Setting("vocab_size", recall.DEFAULTS["vocab_size"], "tokens (keys, values)"),
                Setting("power_a", recall.DEFAULTS["power_a"], "the query gaps' power law"),
                Setting("train_examples", recall.DEFAULTS["train_examples"], "sequences"),
                Setting("test_examples", recall.DEFAULTS["test_examples"], "sequences"),
                _SEED,
                Setting("steps", recall.DEFAULTS["steps"], "training steps per learning rate"),
                Setting("batch", recall.DEFAULTS["batch"], "sequences per step"),
                Setting("lrs", list(recall.DEFAULTS["lrs"]), "AdamW's peak rates: best kept"),
                Setting("warmup", recall.DEFAULTS["warmup"], "linear warmup steps"),
                Setting("weight_decay", recall.DEFAULTS["weight_decay"], "AdamW's"),
                Setting("eval_every", recall.DEFAULTS["eval_every"], "steps between points"),
                Setting("short_conv", recall.DEFAULTS["short_conv"], "kernel size, 0 = none"),
            ),
            (
                Figure("test_accuracy", "number", "over query positions, best learning rate"),
                Figure("chance", "number", "1/num_kv_pairs: one of the example's values"),
                Figure("lr", "number", "the learning rate chosen"),
                Figure("lr_accuracy", "list", "[learning rate, test accuracy] for each"),
                Figure("curve", "list", "[step, test accuracy] every eval_every steps"),
                Figure("steps_per_s", "number", "training steps per second"),
                Figure("peak_bytes", "count", "bytes one training step allocates"),
                Figure("causal", "flag", "trained causally (else bidirectionally)"),
                Figure("short_conv", "count", "the short convolution's kernel, 0 = none"),
                Figure("context_elements", "count", "context memory per layer and sequence"),
                Figure("context_bytes", "count", "the same in fp32 bytes"),
                Figure("train_examples", "count", "sequences trained on"),
                Figure("test_examples", "count", "sequences tested on"),
                Figure("seconds", "number", "the whole call, every learning rate"),
            ),
            _check_mqar,
            runs.mqar,
            trains_causally=True,
            schedules=True,
        ),
    )
}
