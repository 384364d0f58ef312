"""Quality tasks as cells: what ``attnbench run task=approx|spectrum|listops`` measures.

A cost cell (``task=cost``, the default) measures time and memory. A quality cell measures the
same mechanism at the same n and budget from another side, and its row carries the figures in
``quality`` (a mapping), beside the cost rows of the same store:

* ``approx`` — the error against exact softmax attention on the same weights
  (:mod:`attnbench.quality.approx`): on random inputs to fresh seeded layers, averaged over
  ``seeds``, or on each layer's real hidden states in the trained ListOps model
  (``inputs=listops``), averaged over layers (each layer's figures kept too);
* ``spectrum`` — the singular values of each head's P = softmax(QKᵀ/√d) in a vanilla model
  (:mod:`attnbench.quality.spectrum`, the Linformer paper's Figure 1), random or trained;
* ``listops`` — test accuracy on ListOps after a fixed budget of training steps
  (:mod:`attnbench.tasks.classify`), beside the majority class, with steps per second, the
  training peak memory and the accuracy curve.

"The trained ListOps model" is the vanilla classifier that ``task=listops`` trains at the
same settings and seed (training is deterministic on the CPU), trained once per process and
kept: an ``approx`` or ``spectrum`` sweep over it pays for one training run, not one per cell.
This module only adapts cells to those libraries; each rule of a task lives here
(:func:`validate`) and nowhere else.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import torch

import attnbench
from attnbench.checks import check_choice, check_int

if TYPE_CHECKING:
    from attnbench.cell import Cell

INPUTS = ("random", "listops")
# the settings each task takes (conf/config.yaml's quality.<task> block): a key not here is
# a typo, refused in one line
SETTINGS = {
    "approx": ("inputs", "seed", "seeds", "batch", "listops"),
    "spectrum": ("inputs", "seed", "batch", "index", "listops"),
    "listops": (
        "seed", "steps", "batch", "lr", "warmup", "weight_decay", "train_examples",
        "test_examples", "max_depth", "max_args", "eval_every",
    ),
}  # fmt: skip


def _settings(cell: Cell) -> dict[str, Any]:
    return dict(cell.quality)


def validate(cell: Cell) -> None:
    """One ``ValueError`` line naming the first bad key of a quality cell."""
    from attnbench.quality.approx import exact_counterpart
    from attnbench.tasks import listops

    task = cell.task
    s = _settings(cell)
    for key in s:
        check_choice(f"quality.{task}", key, SETTINGS[task], "a setting of this task")
    if cell.mode != "inference":
        raise ValueError(
            f"mode: task={task} measures a quality, not a training step; use inference"
        )
    budget = attnbench.info(cell.attention).budget
    if cell.k is not None and budget is None:
        raise ValueError(f"k: attention={cell.attention} has no budget (task={task})")
    if "seed" in s:
        check_int(f"quality.{task}.seed", s["seed"], low=0)
    if task in ("approx", "spectrum"):
        check_choice(f"quality.{task}.inputs", s.get("inputs", "random"), INPUTS)
        check_int(f"quality.{task}.batch", s.get("batch", 1))
        if s.get("inputs") == "listops":
            listops.check_n(cell.n)
    if task == "approx":
        exact_counterpart(cell.attention)
        check_int("quality.approx.seeds", s.get("seeds", 1))
    if task == "spectrum":
        if cell.attention != "vanilla":
            raise ValueError(
                f"attention: task=spectrum reads softmax's own P: needs vanilla, got "
                f"{cell.attention}"
            )
        index = check_int("quality.spectrum.index", s.get("index", 128))
        if index > cell.n:
            raise ValueError(f"quality.spectrum.index: must be at most n={cell.n}, got {index}")
    if task == "listops":
        listops.check_n(cell.n)


def run(cell: Cell) -> dict[str, Any]:
    """The quality figures of a validated cell (the row's ``quality``)."""
    return {"approx": _approx, "spectrum": _spectrum, "listops": _listops}[cell.task](cell)


def _train_kwargs(cell: Cell, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "n": cell.n,
        "layers": cell.layers,
        "d_model": cell.d_model,
        "n_heads": cell.n_heads,
        "d_ff": cell.d_ff,
        **settings,
    }


@functools.lru_cache(maxsize=2)
def _trained_vanilla(frozen: tuple[tuple[str, Any], ...]) -> Any:
    """The vanilla ListOps classifier, its test inputs and its test accuracy (which ties a
    row measured on it to the task=listops row of the same settings), trained once per
    process."""
    from attnbench.tasks import classify

    result = classify.train("vanilla", {}, **dict(frozen))
    ids, mask = result["test_inputs"]
    return result["model"], ids, mask, result["test_accuracy"]


def _trained_inputs(cell: Cell, batch: int) -> tuple[Any, torch.Tensor, torch.Tensor, float]:
    """(the trained vanilla model's encoder, the embedded test inputs, their padding mask,
    the model's test accuracy):
    the model task=listops trains at this cell's n and model shape and the ``quality.listops``
    settings the sweep carried in (classify's defaults where it carried none)."""
    from attnbench.tasks.classify import DEFAULTS

    carried = dict(_settings(cell).get("listops", ()))
    settings = {k: v for k, v in DEFAULTS.items() if k in SETTINGS["listops"]}
    settings.update({k: v for k, v in carried.items() if k in SETTINGS["listops"]})
    frozen = tuple(sorted(_train_kwargs(cell, settings).items()))
    model, ids, mask, accuracy = _trained_vanilla(frozen)
    with torch.no_grad():
        x = model.embed(ids[:batch])
    return model.encoder, x, mask[:batch], accuracy


# uniform attention (every query averages every real value): Linformer with one mean-pooled
# row. Untrained layers on random inputs attend almost uniformly, so every error is read
# beside this one's, measured on the same inputs and weights
UNIFORM = ("linformer", (("k", 1), ("projection", "mean"), ("sharing", "none")))


def _approx(cell: Cell) -> dict[str, Any]:
    out = dict(_approx_of(cell))
    # the same inputs, seeds and weights: only the mechanism differs (cached per sweep)
    uniform = _approx_of(dataclasses.replace(cell, attention=UNIFORM[0], k=None, params=UNIFORM[1]))
    out["uniform_rel_frobenius"] = uniform["rel_frobenius"]
    out["uniform_row_error"] = uniform["row_error"]
    return out


@functools.lru_cache(maxsize=8)
def _approx_of(cell: Cell) -> dict[str, Any]:
    from attnbench.quality import approx

    s = _settings(cell)
    attention, params = cell.attention, cell.mechanism_params()
    if s.get("inputs", "random") == "random":
        seed = s.get("seed", 0)
        out = approx.random_inputs_error(
            attention,
            params,
            n=cell.n,
            d_model=cell.d_model,
            n_heads=cell.n_heads,
            batch=s.get("batch", 2),
            seeds=tuple(range(seed, seed + s.get("seeds", 3))),
        )
        return {"inputs": "random", **out}
    encoder, x, mask, accuracy = _trained_inputs(cell, s.get("batch", 2))
    layers = approx.layerwise_error(
        encoder, attention, params, x=x, key_padding_mask=mask, seed=s.get("seed", 0)
    )
    mean = approx.mean_metrics(layers)
    return {"inputs": "listops", "model_accuracy": accuracy, "layers": layers, **mean}


def _spectrum(cell: Cell) -> dict[str, Any]:
    from attnbench.quality import spectrum

    s = _settings(cell)
    index = s.get("index", 128)
    if s.get("inputs", "random") == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s.get("seed", 0))
            model = attnbench.build_model(
                "vanilla",
                layers=cell.layers,
                d_model=cell.d_model,
                n_heads=cell.n_heads,
                d_ff=cell.d_ff,
                max_seq_len=cell.n,
            )
            x = torch.randn(s.get("batch", 2), cell.n, cell.d_model)
        return {"inputs": "random", **spectrum.spectrum(model, x, index=index)}
    encoder, x, mask, accuracy = _trained_inputs(cell, s.get("batch", 2))
    out = spectrum.spectrum(encoder, x, mask, index=index)
    return {"inputs": "listops", "model_accuracy": accuracy, **out}


def _listops(cell: Cell) -> dict[str, Any]:
    from attnbench.tasks import classify

    out = classify.train(
        cell.attention, cell.mechanism_params(), **_train_kwargs(cell, _settings(cell))
    )
    for name in classify.OBJECTS:
        out.pop(name)
    out["curve"] = [list(point) for point in out["curve"]]
    return out
