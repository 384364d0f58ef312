"""How each quality task measures a cell: the ``run`` of each entry of
:data:`attnbench.quality.tasks.REGISTRY`, given the cell and its resolved settings.

* ``approx`` — the error against exact softmax attention on the same weights
  (:mod:`attnbench.quality.approx`): on random inputs to fresh seeded layers, averaged over
  ``seeds``, or on each layer's real hidden states in the trained ListOps model
  (``inputs=listops``), averaged over layers (each layer's figures kept too);
* ``spectrum`` — the singular values of each head's P = softmax(QKᵀ/√d) in a vanilla model
  (:mod:`attnbench.quality.spectrum`, the Linformer paper's Figure 1), random or trained;
* ``listops`` — test accuracy on ListOps after a fixed budget of training steps
  (:mod:`attnbench.quality.classify`), beside the majority class, with steps per second, the
  training peak memory and the accuracy curve;
* ``mqar`` — recall accuracy on Zoology's multi-query associative recall after a fixed
  budget, at the best of a few learning rates (:mod:`attnbench.quality.recall`), beside
  chance, with the context memory per layer; a cell's layer schedule builds the model.

"The trained ListOps model" is the vanilla classifier that ``task=listops`` trains at the
same settings and seed (training is deterministic on the CPU), trained once per process and
kept: an ``approx`` or ``spectrum`` sweep over it pays for one training run, not one per cell.
This module only adapts cells to those libraries; the tasks' rules are in
:mod:`attnbench.quality.tasks`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from attnbench.cell import Cell

Settings = dict[str, Any]


def _train_kwargs(cell: Cell, settings: Settings) -> dict[str, Any]:
    return {
        "n": cell.n,
        "layers": cell.model.layers,
        "d_model": cell.model.d_model,
        "n_heads": cell.model.n_heads,
        "d_ff": cell.model.d_ff,
        **settings,
    }


@functools.lru_cache(maxsize=2)
def _trained_vanilla(frozen: tuple[tuple[str, Any], ...]) -> Any:
    """The vanilla ListOps classifier, its test inputs and its test accuracy (which ties a
    row measured on it to the task=listops row of the same settings), trained once per
    process."""
    from attnbench.quality import classify

    result = classify.train("vanilla", {}, **dict(frozen))
    ids, mask = result["test_inputs"]
    return result["model"], ids, mask, result["test_accuracy"]


def _trained_inputs(cell: Cell, s: Settings) -> tuple[Any, torch.Tensor, torch.Tensor, float]:
    """(the trained vanilla model's encoder, the embedded test inputs, their padding mask,
    the model's test accuracy): the model task=listops trains at this cell's n and model
    shape and the ``quality.listops`` settings in ``s["listops"]``."""
    frozen = tuple(sorted(_train_kwargs(cell, s["listops"]).items()))
    model, ids, mask, accuracy = _trained_vanilla(frozen)
    batch = s["batch"]
    with torch.no_grad():
        x = model.embed(ids[:batch])
    return model.encoder, x, mask[:batch], accuracy


# uniform attention (every query averages every real value): Linformer with one mean-pooled
# row. Untrained layers on random inputs attend almost uniformly, so every error is read
# beside this one's, measured on the same inputs (on random inputs against its own seeded exact
# layer: each mechanism's create() draws from the seed first, so the weights differ; on a
# trained model's states, against the same trained layer)
UNIFORM = ("linformer", (("k", 1), ("projection", "mean"), ("sharing", "none")))


def _frozen(s: Settings) -> tuple[tuple[str, Any], ...]:
    """``s`` as a cache key: the carried ``listops`` block as sorted pairs."""
    return tuple(
        sorted((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in s.items())
    )


def approx(cell: Cell, s: Settings) -> dict[str, Any]:
    out = dict(_approx_of(cell, _frozen(s)))
    # the same inputs and seeds (cached per sweep); the exact layer is the same only on trained
    # states, see UNIFORM
    uniform_cell = dataclasses.replace(cell, attention=UNIFORM[0], k=None, params=UNIFORM[1])
    uniform = _approx_of(uniform_cell, _frozen(s))
    out["uniform_rel_frobenius"] = uniform["rel_frobenius"]
    out["uniform_row_error"] = uniform["row_error"]
    return out


@functools.lru_cache(maxsize=8)
def _approx_of(cell: Cell, frozen: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    from attnbench.quality import approx

    s = dict(frozen)
    attention, params = cell.attention, cell.mechanism_params()
    if s["inputs"] == "random":
        seed = s["seed"]
        out = approx.random_inputs_error(
            attention,
            params,
            n=cell.n,
            d_model=cell.model.d_model,
            n_heads=cell.model.n_heads,
            batch=s["batch"],
            seeds=tuple(range(seed, seed + s["seeds"])),
        )
        return {"inputs": "random", **out}
    encoder, x, mask, accuracy = _trained_inputs(cell, {**s, "listops": dict(s["listops"])})
    layers = approx.layerwise_error(
        encoder, attention, params, x=x, key_padding_mask=mask, seed=s["seed"]
    )
    mean = approx.mean_metrics(layers)
    return {"inputs": "listops", "model_accuracy": accuracy, "layers": layers, **mean}


def spectrum(cell: Cell, s: Settings) -> dict[str, Any]:
    from attnbench.model import build_model
    from attnbench.quality import spectrum

    index = s["index"]
    if s["inputs"] == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s["seed"])
            model = build_model(
                "vanilla",
                layers=cell.model.layers,
                d_model=cell.model.d_model,
                n_heads=cell.model.n_heads,
                d_ff=cell.model.d_ff,
                max_seq_len=cell.n,
            )
            x = torch.randn(s["batch"], cell.n, cell.model.d_model)
        return {"inputs": "random", **spectrum.spectrum(model, x, index=index)}
    encoder, x, mask, accuracy = _trained_inputs(cell, s)
    out = spectrum.spectrum(encoder, x, mask, index=index)
    return {"inputs": "listops", "model_accuracy": accuracy, **out}


def listops(cell: Cell, s: Settings) -> dict[str, Any]:
    from attnbench.quality import classify

    out = classify.train(cell.attention, cell.mechanism_params(), **_train_kwargs(cell, s))
    for name in classify.OBJECTS:
        out.pop(name)
    out["curve"] = [list(point) for point in out["curve"]]
    return out


def mqar(cell: Cell, s: Settings) -> dict[str, Any]:
    """The recall model built as the cost model is: a cell's schedule through
    :func:`attnbench.schedule.layers_of`, each layer its kind's mechanism."""
    from attnbench.quality import recall
    from attnbench.schedule import layers_of

    params = cell.mechanism_params()
    schedule = layers_of(cell, params) if cell.model.schedule is not None else None
    out = recall.train(cell.attention, params, schedule=schedule, **_train_kwargs(cell, s))
    out.pop("model")
    out["curve"] = [list(point) for point in out["curve"]]
    return out
