"""A sequence classifier over any registered attention, and its fixed-budget training run.

The model is LRA's shape for ListOps, small: a token embedding plus a learned positional
embedding (LRA learns one too), :func:`attnbench.build_model` with the mechanism under test,
a mean over the real (non-padding) positions and a linear layer to the classes. Everything but
the attention is the same for every mechanism, so accuracy differences are the attention's.
With ``per_position=True`` the same model labels every position instead (no mean: the linear
layer over each position's state, logits (b, n, classes)), as multi-query associative recall
needs (:mod:`attnbench.quality.recall`); both train with :mod:`attnbench.quality.training`.

:func:`train` trains one from scratch for a fixed number of AdamW steps (linear warmup, then
linear decay to zero; gradients clipped at norm 1), deterministic from its seed: the data,
the initial weights, the batch order and any randomness inside a mechanism (Performer's
features, Reformer's hashes) all come from it. It returns the test accuracy beside the
majority-class accuracy, the training speed, the training peak memory of one step and the
trained model (whose :meth:`Classifier.embed` and ``.encoder`` give the hidden states of each
layer to the approximation-error study).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from attnbench import registry
from attnbench.model import build_model
from attnbench.quality import listops
from attnbench.quality.training import fit
from attnbench.schedule import Layer
from attnbench.validators import check_choice, check_int, check_number

# Chosen by measurement (torch 2.13 CPU, 2 cores shared with another job, so pessimistic):
# vanilla reaches 34.7 % test accuracy against a 16.2 % majority class (LRA's Transformer:
# 36.37 % at n = 2000), at 3.3 steps/s, 285 s for the whole call; linear 33.9 % at 24.6
# steps/s (49 s); local (window 64) 33.7 % at 19.8 steps/s (56 s). n = 256 rather than LRA's
# 2000 because vanilla's eager n × n attention trains at ~3.7 steps/s here already; 800 steps
# because the test accuracy plateaus after ~200-400 (LRA: 5000 steps at batch 32).
# what :func:`train` returns beside its figures: objects, not JSON (a row stores neither)
OBJECTS = ("model", "test_inputs")
DEFAULTS: dict[str, Any] = {
    "n": 256,  # LRA: 2000; expressions of n/4..n tokens as LRA's 500..2000
    "steps": 800,
    "batch": 32,  # LRA: 32
    "lr": 1e-3,
    "warmup": 100,
    "weight_decay": 0.01,
    "layers": 2,  # LRA: 4 (its ListOps config); d_model 512, 8 heads, d_ff 2048
    "d_model": 64,
    "n_heads": 4,
    "d_ff": 128,
    "train_examples": 20_000,  # LRA: 96 000
    "test_examples": 1000,  # LRA: 2000
    "max_depth": 10,  # as LRA
    "max_args": 10,  # as LRA
    "eval_every": 200,
}


class Classifier(nn.Module):
    """ids (b, n) and a padding mask (b, n, True = padding) -> logits (b, n_classes), or with
    ``per_position`` logits (b, n, n_classes): a label for every position.

    ``params`` go to the attention (``k``, ``window`` …); ``n`` is the longest input and,
    for a fixed-length mechanism (Linformer), the one length it takes. ``padding_idx`` is
    the token whose embedding is fixed at zero (ListOps' padding), or None where every token
    is real (MQAR's filler is a token like any other). ``schedule``: one
    :class:`~attnbench.schedule.Layer` per layer (a hybrid, as
    :func:`attnbench.model.build_model` takes it), in place of ``attention`` in every layer.
    """

    def __init__(
        self,
        attention: str,
        *,
        vocab: int,
        n: int,
        layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_classes: int = listops.N_CLASSES,
        per_position: bool = False,
        padding_idx: int | None = 0,
        schedule: Sequence[Layer] | None = None,
        **params: Any,
    ) -> None:
        super().__init__()
        check_choice("attention", attention, registry.names(), "a registered mechanism")
        check_int("vocab", vocab, low=2)
        check_int("n", n)
        check_int("n_classes", n_classes, low=2)
        self.attention, self.n, self.per_position = attention, n, per_position
        # a mechanism registered without padding support gets no mask (it would refuse one);
        # the mean-pool still ignores padding, but its attention mixes padding in
        mechanisms = {attention, *(layer.attention for layer in schedule or ())}
        self.masks_keys = all(registry.info(m).padding_mask for m in mechanisms)
        self.tokens = nn.Embedding(vocab, d_model, padding_idx=padding_idx)
        self.positions = nn.Embedding(n, d_model)
        self.encoder = build_model(
            attention,
            layers=layers,
            d_model=d_model,
            n_heads=n_heads,
            d_ff=d_ff,
            max_seq_len=n,
            schedule=schedule,
            **params,
        ).train()  # build_model returns it in eval mode, ready to measure
        self.head = nn.Linear(d_model, n_classes)

    def embed(self, ids: Tensor) -> Tensor:
        """(b, n) ids -> (b, n, d_model): what enters the encoder's layer 0."""
        if ids.dim() != 2 or not 1 <= ids.shape[1] <= self.n:
            raise ValueError(f"ids: must be (batch, 1..{self.n}), got {tuple(ids.shape)}")
        return self.tokens(ids) + self.positions.weight[: ids.shape[1]]

    def forward(self, ids: Tensor, mask: Tensor | None = None, at: Tensor | None = None) -> Tensor:
        """Logits (b, n_classes); per position (b, n, n_classes), or with ``at`` (b, n, True
        where a label is wanted) only those positions', (count, n_classes) in row-major
        order: the head, the largest matmul of a small model over a large vocabulary, then
        runs only where the loss looks."""
        h = self.encoder(self.embed(ids), mask if self.masks_keys else None)  # (b, n, d)
        if self.per_position:
            return self.head(h if at is None else h[at])
        if mask is None:
            return self.head(h.mean(dim=1))
        keep = (~mask).unsqueeze(-1).to(h.dtype)  # (b, n, 1): 1 on real tokens
        pooled = (h * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)
        return self.head(pooled)  # (b, n_classes)


def train(
    attention: str,
    params: dict[str, Any] | None = None,
    *,
    n: int = DEFAULTS["n"],
    steps: int = DEFAULTS["steps"],
    batch: int = DEFAULTS["batch"],
    lr: float = DEFAULTS["lr"],
    seed: int = 0,
    warmup: int = DEFAULTS["warmup"],
    weight_decay: float = DEFAULTS["weight_decay"],
    layers: int = DEFAULTS["layers"],
    d_model: int = DEFAULTS["d_model"],
    n_heads: int = DEFAULTS["n_heads"],
    d_ff: int = DEFAULTS["d_ff"],
    train_examples: int = DEFAULTS["train_examples"],
    test_examples: int = DEFAULTS["test_examples"],
    max_depth: int = DEFAULTS["max_depth"],
    max_args: int = DEFAULTS["max_args"],
    min_len: int | None = None,
    max_len: int | None = None,
    eval_every: int = DEFAULTS["eval_every"],
    progress: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Train a :class:`Classifier` on ListOps from scratch; its figures and the model.

    Expressions are ``min_len``..``max_len`` tokens (default ``n // 4``..``n``, LRA's ratio),
    padded to ``n``. The training set comes from the stream ``2·seed``, the test set from
    ``2·seed + 1`` with every training expression excluded, so no example is in both.

    Returns ``test_accuracy`` (after the last step), ``majority_accuracy`` (the most common
    test label's share: what predicting one class scores), ``steps_per_s`` (training steps
    only, evaluation and the profiled step excluded), ``peak_bytes`` (CPU bytes one training
    step allocates above what lives before it, weights and AdamW state included in that: its
    activations, gradients and temporaries, from :func:`profiled_peak` around the second
    step), ``curve`` ([(step, test accuracy)] every ``eval_every`` steps and at the end),
    ``train_examples``, ``test_examples``, ``seconds`` (the whole call), and two objects
    (:data:`OBJECTS`, not figures): ``model`` (the trained :class:`Classifier`, in eval
    mode) and ``test_inputs`` (the test set's ids and padding mask as the model took them,
    for studies of its hidden states). ``progress(step, accuracy)`` is called after each
    evaluation (a progress bar, a log line).

    Figures measured at :data:`DEFAULTS` are beside it, above.
    """
    started = time.perf_counter()
    params = dict(params or {})
    check_choice("attention", attention, registry.names(), "a registered mechanism")
    n = listops.check_n(n, n if max_len is None else max_len)
    check_settings(
        n, steps=steps, batch=batch, lr=lr, seed=seed, warmup=warmup, weight_decay=weight_decay,
        train_examples=train_examples, test_examples=test_examples, max_depth=max_depth,
        max_args=max_args, eval_every=eval_every, min_len=min_len, max_len=max_len,
    )  # fmt: skip
    min_len, max_len = lengths(n, min_len, max_len)
    sets = listops.splits(
        n, seed, train_examples, test_examples,
        min_len=min_len, max_len=max_len, max_depth=max_depth, max_args=max_args,
    )  # fmt: skip
    model = functools.partial(
        Classifier, attention, vocab=len(listops.VOCAB), n=n, layers=layers, d_model=d_model,
        n_heads=n_heads, d_ff=d_ff, **params,
    )  # fmt: skip
    figures, model = fit(
        model, (sets.x_train, sets.m_train, sets.y_train), (sets.x_test, sets.m_test, sets.y_test),
        seed=seed, lr=lr, weight_decay=weight_decay, steps=steps, warmup=warmup, batch=batch,
        eval_every=eval_every, progress=progress,
    )  # fmt: skip
    model.eval()
    return {
        "test_accuracy": figures["curve"][-1][1],
        "majority_accuracy": sets.majority,
        **figures,
        "train_examples": sets.train_size,
        "test_examples": sets.test_size,
        "seconds": time.perf_counter() - started,
        "model": model,
        "test_inputs": (sets.x_test, sets.m_test),
    }


def lengths(n: int, min_len: int | None = None, max_len: int | None = None) -> tuple[int, int]:
    """(min_len, max_len) of the expressions: by default ``n // 4``..``n``, LRA's ratio."""
    max_len = n if max_len is None else max_len
    return (max(1, max_len // 4) if min_len is None else min_len), max_len


def check_settings(
    n: int, *, prefix: str = "", steps: int, batch: int, lr: float, seed: int, warmup: int,
    weight_decay: float, train_examples: int, test_examples: int, max_depth: int,
    max_args: int, eval_every: int, min_len: int | None = None, max_len: int | None = None,
) -> None:  # fmt: skip
    """One line for the first bad setting of a training run at a valid ``n``, in this order, named
    ``prefix`` + its name. :func:`train` checks its own arguments with it; the listops task
    checks a cell's ``quality.listops`` block with it (``prefix="quality.listops."``) before
    any cell runs, so a typo is refused rather than stored as an ``error`` row."""
    check_int(f"{prefix}steps", steps)
    check_int(f"{prefix}batch", batch)
    check_number(f"{prefix}lr", lr, low=0, open_low=True)
    check_int(f"{prefix}seed", seed, low=0)
    check_int(f"{prefix}warmup", warmup, low=0)
    check_number(f"{prefix}weight_decay", weight_decay, low=0)
    check_int(f"{prefix}train_examples", train_examples)
    check_int(f"{prefix}test_examples", test_examples)
    check_int(f"{prefix}eval_every", eval_every)
    listops.check_shape(*lengths(n, min_len, max_len), max_depth, max_args, prefix)
