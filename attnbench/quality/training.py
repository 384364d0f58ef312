"""The fixed-budget training both trained quality tasks share: ListOps' classifier
(:mod:`attnbench.quality.classify`, a label per sequence) and MQAR's
(:mod:`attnbench.quality.recall`, a label per position).

One piece of code for both: a label of :data:`IGNORE` (-100, cross-entropy's ``ignore_index``)
is neither trained on (:func:`loss`) nor counted (:func:`accuracy`); a ListOps label never is
one, so ListOps trains and scores exactly as before the per-position labels. AdamW with linear
warmup then linear decay to zero (:func:`adamw`), one clipped step per call in a seeded order
(:class:`Stepper`), the run itself (:func:`loop`): the second step profiled for the
training peak, the others timed, the test accuracy every ``eval_every`` steps; and a model
trained from scratch under its own seed with all three (:func:`fit`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench import env
from attnbench.measure.memory import profiled_peak

IGNORE = -100  # a label neither trained on nor counted (F.cross_entropy's ignore_index)
# the fp32 copies AdamW keeps of each parameter: the weight, its gradient, two moments
ADAMW_COPIES = 4


def check_fits(need: dict[str, int], have: int | None = None) -> None:
    """A training run's tensors, in bytes by the key whose value sizes them, must fit the
    memory of this machine (:func:`attnbench.env.memory_bytes`; ``have`` in tests), where
    the run trains: else one line naming the key of the largest share, before anything is
    allocated, rather than minutes of swapping or an error row after a failed allocation."""
    have = env.memory_bytes() if have is None else have
    if (total := sum(need.values())) <= have:
        return
    key = max(need, key=need.__getitem__)
    shares = ", ".join(f"{k.rpartition('.')[2]} {b:.3g}" for k, b in need.items())
    raise ValueError(
        f"{key}: the training needs about {total:.3g} bytes ({shares}), above the {have} "
        f"bytes of memory this machine has; allowed: a smaller {key.rpartition('.')[2]}"
    )


def loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the labels that are not :data:`IGNORE`: logits (..., classes)
    against labels (...), a sequence's one label (b,) or a label per position (b, n)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE
    )


def accuracy(
    model: nn.Module, ids: Tensor, mask: Tensor | None, labels: Tensor, batch: int = 250
) -> float:
    """Share of correct argmax predictions over the labels that are not :data:`IGNORE` (every
    sequence's label; MQAR's query positions), in eval mode, without gradients."""
    was_training = model.training
    model.eval()
    correct = counted = 0
    with torch.inference_mode():
        for i in range(0, len(labels), batch):
            rows = slice(i, i + batch)
            logits, y = labelled(model, ids[rows], _rows(mask, rows), labels[rows])
            keep = y != IGNORE
            correct += int(((logits.argmax(-1) == y) & keep).sum())
            counted += int(keep.sum())
    model.train(was_training)
    return correct / counted


def labelled(
    model: nn.Module, ids: Tensor, mask: Tensor | None, labels: Tensor
) -> tuple[Tensor, Tensor]:
    """(logits, labels) for :func:`loss` and :func:`accuracy`: a per-position model's at its
    labelled positions only (its head runs nowhere else: MQAR labels num_kv_pairs of n), any
    other model's as it gives them."""
    if not getattr(model, "per_position", False):
        return model(ids, mask), labels
    at = labels != IGNORE
    return model(ids, mask, at), labels[at]


def _rows(mask: Tensor | None, idx: Any) -> Tensor | None:
    """The padding mask of the sequences ``idx``; None where inputs are never padded."""
    return None if mask is None else mask[idx]


def _lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then linear decay to 0 at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (steps - step) / max(1, steps - warmup))


_Optimizer = tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]


def adamw(model: nn.Module, lr: float, weight_decay: float, steps: int, warmup: int) -> _Optimizer:
    """AdamW and its schedule: linear warmup over ``warmup`` steps, then decay to 0."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda i: _lr_factor(i, steps, warmup))


# a data set as the training takes it: (ids, padding mask or None, labels)
Data = tuple[Tensor, Tensor | None, Tensor]


class Stepper:
    """One optimizer step per call on the next ``batch`` of ``data`` in an order drawn from
    ``seed``, a new order each epoch; the loss is :func:`loss`, gradients clipped at norm 1."""

    def __init__(
        self, model: nn.Module, data: Data, batch: int, optimizer: _Optimizer, seed: int
    ) -> None:
        self.model, self.data, self.batch = model, data, batch
        self.opt, self.sched = optimizer
        self.order = torch.Generator().manual_seed(seed)
        self.perm, self.at = torch.randperm(len(data[2]), generator=self.order), 0

    def __call__(self) -> None:
        ids, mask, labels = self.data
        if self.at + self.batch > len(self.perm):  # a new epoch, a new order
            self.perm, self.at = torch.randperm(len(labels), generator=self.order), 0
        idx = self.perm[self.at : self.at + self.batch]
        self.at += self.batch
        loss(*labelled(self.model, ids[idx], _rows(mask, idx), labels[idx])).backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)


def loop(
    step: Stepper,
    test: Data,
    steps: int,
    eval_every: int,
    progress: Callable[[int, float], None] | None,
) -> dict[str, Any]:
    """``steps`` steps, the second profiled (step 1 made AdamW's state: step 2 is a steady
    one) and the others timed, the accuracy on ``test`` every ``eval_every`` steps and at the
    end: ``steps_per_s``, ``peak_bytes`` and ``curve``, as
    :func:`attnbench.quality.classify.train` describes them."""
    curve = []
    peak_bytes, train_seconds, timed_steps = 0, 0.0, 0
    for s in range(1, steps + 1):
        if s == min(2, steps):
            peak_bytes = profiled_peak(step)
        else:
            t0 = time.perf_counter()
            step()
            train_seconds += time.perf_counter() - t0
            timed_steps += 1
        if s % eval_every == 0 or s == steps:
            curve.append((s, accuracy(step.model, *test)))
            if progress is not None:
                progress(*curve[-1])
    return {
        "steps_per_s": timed_steps / train_seconds if train_seconds > 0 else math.nan,
        "peak_bytes": peak_bytes,
        "curve": curve,
    }


def fit(
    model: Callable[[], nn.Module],
    train: Data,
    test: Data,
    *,
    seed: int,
    lr: float,
    weight_decay: float,
    steps: int,
    warmup: int,
    batch: int,
    eval_every: int,
    progress: Callable[[int, float], None] | None,
) -> tuple[dict[str, Any], nn.Module]:
    """(:func:`loop`'s figures, the model) of ``model()`` trained from scratch on ``train``:
    its initial weights, the batch order and any randomness inside a mechanism (Performer's
    features, Reformer's hashes) from ``seed``, under a forked RNG, so that the caller's
    global RNG is left as it was; :func:`adamw`, :class:`Stepper`, :func:`loop`. The model
    is left in training mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = model()
        step = Stepper(net, train, batch, adamw(net, lr, weight_decay, steps, warmup), seed)
        return loop(step, test, steps, eval_every, progress), net
