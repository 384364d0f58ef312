"""How long a trained quality cell (``task=listops``, ``task=mqar``) will train on this CPU,
said before it starts when that is more than a few minutes.

A training task runs its steps in full on this machine's CPU, with no time budget: a
12-layer model at MQAR's defaults trains for days (two rates × 2000 steps, ~45 s a step on
2 cores). So ``attnbench run`` says so before anything runs (:func:`note`), from the run's
matmul FLOPs (the encoder's own counts, forward and backward, the head, every evaluation)
at this CPU's measured fp32 GEMM rate (:mod:`attnbench.measure.gemm`), the estimate a cost
cell's ``time_budget_s`` is held against too. On the 12-layer model it is within 10 % of
the steps' measured time; a small model's steps are slower than their FLOPs say (Python's
overhead per op), so the figure is a floor, and a model too small for it to pass a few
minutes says nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attnbench.measure import gemm
from attnbench.model import cell_encoder
from attnbench.quality import tasks

if TYPE_CHECKING:
    from attnbench.cell import Cell

NOTE_AFTER_S = 180.0  # "a few minutes": a training estimated longer is said before it starts
# no CPU computes fp32 matmuls faster than this (FLOP/s): a run whose FLOPs at this rate fit
# NOTE_AFTER_S is never said, and this CPU's rate need not be read for it
FASTEST_CPU = 1e13


def training_flops(cell: Cell) -> tuple[int, str] | None:
    """The matmul FLOPs of a trained task's whole run and the run in words, or None for a
    task that trains nothing here (approx, spectrum on random inputs, a plugin's)."""
    s = tasks.quality_settings(cell)
    if cell.task.name == "mqar":
        from attnbench.quality.recall import causal

        params = {**cell.mechanism_params(), "causal": causal(cell.attention)}
        runs, labelled, classes = len(s["lrs"]), s["num_kv_pairs"], s["vocab_size"]
    elif cell.task.name == "listops":
        from attnbench.quality.listops import N_CLASSES

        params, runs, labelled, classes = cell.mechanism_params(), 1, 1, N_CLASSES
    else:
        return None
    encoder = cell_encoder(cell, params, "meta")
    head = 2 * cell.model.d_model * classes * labelled  # per sequence, forward; backward twice

    def forward(b: int) -> int:
        return encoder.flops(b, cell.n) + b * head

    b = s["batch"]
    step = forward(b) + encoder.flops_backward(b, cell.n) + 2 * b * head
    evals = math.ceil(s["steps"] / s["eval_every"])
    total = runs * (s["steps"] * step + evals * forward(s["test_examples"]))
    rates = f"{runs} rates × " if runs > 1 else ""
    words = (
        f"{rates}{s['steps']} steps of {s['batch']} sequences at {step / 1e12:.2g} TFLOP "
        f"each, {evals} evaluations of {s['test_examples']}"
    )
    return total, words


def note(cell: Cell) -> str | None:
    """One line for a trained quality cell whose training is estimated above
    :data:`NOTE_AFTER_S` on this CPU: the estimate and what it is made of; else None."""
    if cell.task.name == "cost" or (found := training_flops(cell)) is None:
        return None
    flops, words = found
    if flops / FASTEST_CPU <= NOTE_AFTER_S:
        return None
    rate = gemm.cpu_matmul_rate().quiet
    if (seconds := flops / rate) <= NOTE_AFTER_S:
        return None
    shape = f"{cell.model.layers} layers of d_model {cell.model.d_model}"
    return (
        f"task={cell.task.name} on {cell.attention} ({shape}): about {_duration(seconds)} of "
        f"training on this CPU ({words}, at its fp32 GEMM rate of {rate / 1e9:.0f} GFLOP/s)"
    )


def _duration(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
