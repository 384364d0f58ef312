"""Multi-query associative recall (MQAR) as Zoology generates it, from a seed, with no download.

Zoology (Arora, Eyuboglu et al., 2023) defines the task in ``zoology/data/associative_recall.py``
(``multiquery_ar`` and its ``_mqar``, commit 0123f0d; the same construction, with
``num_passes=1``, is ``zoology/data/multiquery_ar.py`` at dbcb60d). An example of length n with
P = ``num_kv_pairs`` and vocabulary V (``generate(1, seed=1, n=16, num_kv_pairs=2,
vocab_size=20)``; . is :data:`IGNORE`, -100)::

    position   0   1   2   3   4  5   6  7   8  9 10 11 12 13 14 15
    input      7  10   9  11   0  0   7  0   9  0  0  0  0  0  0  0
    label      .   .   .   .   .  .  10  .  11  .  .  .  .  .  .  .

built as Zoology builds it, step by step:

1. **Pairs.** P distinct keys drawn uniformly from ``[1, V//2)`` (``key_choices =
   np.arange(1, key_vocab_size)``, ``key_vocab_size = vocab_size // 2``) and P distinct values
   from ``[V//2, V)`` (``value_choices``), each an ordered draw without replacement
   (``np.random.choice(..., replace=False, size=num_kv_pairs)``); key i is bound to value i.
   Token 0 is neither: it is the filler.
2. **Context.** The pairs fill the first 2P positions as k v k v … (``kvs[:, 0::2] = keys``,
   ``kvs[:, 1::2] = values``).
3. **Gaps.** ``space = (n - 2P) // 2`` query slots follow, at the even offsets 0, 2, …,
   2(space−1) after the context. P distinct slots j are drawn without replacement with
   weights ``p_j ∝ a·(j+1)^(a−1)``, a = ``power_a`` (``p = power_a * np.arange(1, space + 1)
   ** (power_a - 1)``, then ``np.random.choice(np.arange(space), replace=False, p=p,
   size=num_kv_pairs)``). Draws without replacement with ``p`` are successive: the first is
   ∝ p, each next ∝ p over the slots left (numpy's ``choice``), and the i-th draw goes to key
   i, so key 0's slot is distributed exactly as p (a test checks it). a = 1 is uniform; the
   default 0.01 puts most queries close after the context (p ∝ ~1/g).
4. **Queries.** Key i is written at position ``2P + 2·j_i`` (``np.put_along_axis(queries,
   gaps * 2, values=keys, axis=1)``): every key is queried exactly once, after the context.
5. **Labels.** The bound value is the label *at the query position* and every other label is
   :data:`IGNORE` (-100). Zoology writes the value at ``2P + 2·j_i + 1`` of a label row one
   longer than the input and returns ``labels[:, 1:]`` (next-token targets), with
   ``examples[:, :-1]`` as the input: the label of position ``2P + 2·j_i`` is the value, and
   the input at ``2P + 2·j_i + 1`` is a filler (the query region is zeros but for the keys, at
   even offsets only). This module builds that result directly.
6. **Fillers.** Every other position is token :data:`FILLER` (0). Zoology's
   ``random_non_queries=True`` would overwrite the zeros with random tokens; its figure
   configurations (``iclr24_zoology_figure2/configs.py``: ``"random_non_queries": False``)
   turn that off, and so does this module, always: a random filler could be a value token
   after its query. The filler is a token like any other, not padding: every position is
   real (Zoology masks none), so no padding mask goes with the inputs.

**A value never appears after its query**, so a bidirectional model cannot read the answer
from the input: value tokens occur only at positions 1, 3, …, 2P−1, all before the first
query slot (2P); the query region holds only keys and fillers, and the position after each
query, where a language model would read the value, is a filler. The answer is predicted *at*
the query position, where the input is the key. This is Zoology's own layout, not a change
to it (the training work relies on it: mechanisms with no causal form train bidirectionally).

Zoology's constraints are kept and checked in one line each (:func:`check_shape`): n even,
V > n, 4P ≤ n (so there are at least P query slots: space = n/2 − P ≥ P). V > n ≥ 4P also
leaves room for P distinct keys (V//2 − 1 of them) and values (V − V//2); the check says so.

Differences, each for a reason:

* Random numbers: a private ``numpy.random.Generator`` (PCG64) per call, never numpy's
  global state (Zoology calls ``np.random.seed``). The draws are vectorised, so the stream is
  not Zoology's, but each draw has the same distribution: keys and values are i.i.d. uniform
  with a row that repeats one drawn again (or, where repeats would be common, the P smallest
  of i.i.d. uniforms over the choices, in increasing order), a uniform ordered draw without
  replacement either way; the slots are the P earliest of independent exponential arrival
  times with rates p_j, in order, which is successive sampling ∝ p (the exponential race).
  Generation runs in blocks of rows (at most :data:`_CELLS` numbers per draw) to bound memory.
* The test set: Zoology draws it with ``seed + 10`` and only warns when more than 0.1 % of
  it is in the training set. :func:`splits` uses the streams ``2·seed`` and ``2·seed + 1``, as
  ListOps does (so one seed's test set is never another seed's training set), and draws again
  for any test example that is in the training set, so no example is in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnbench.validators import check_int, check_number

FILLER = 0  # Zoology's zeros; never a key (keys start at 1) nor a value
IGNORE = -100  # the label of a position that is not a query (cross_entropy's ignore_index)
# the smallest n: one pair (2 tokens) and its query slot (2 tokens), as 4·pairs <= n asks
MIN_N = 4
# Zoology's smallest Figure 2 configuration is n = 64, 4 pairs, V = 8192, 100 000 training
# and 3000 test examples; n = 64 is kept. 8 pairs: Zoology's own default (MQARConfig and
# _mqar), half what n = 64 holds. V = 2048 rather than 8192: still above the ">1k" Zoology's
# docstring names as what separates architectures, above any n up to 2047 (V > n), and
# each key token is seen 4x as often for the same data (train_examples·P/(V/2 − 1): 156
# times here against 98 in Zoology's smallest configuration, and 8 in the reported CPU run
# of 8000 examples at V = 8192 where vanilla stayed at chance: a likely cause, not a measured
# one, for the calibration to confirm); the embedding and output are 4x smaller. 20 000
# training examples as ListOps; 3000 test examples as Zoology. Generating the defaults'
# splits takes ~0.1 s (100 000 examples at V = 8192: ~0.3 s).
DEFAULTS: dict[str, Any] = {
    "n": 64,  # Zoology: 64 to 512
    "num_kv_pairs": 8,  # Zoology: 4 to 64 (Figure 2), default 8
    "vocab_size": 2048,  # Zoology: 8192
    "power_a": 0.01,  # as Zoology
    "train_examples": 20_000,  # Zoology: 100 000
    "test_examples": 3000,  # as Zoology
    "seed": 0,
}
_CELLS = 1 << 21  # random numbers drawn per block of rows (16 MiB of float64)
# a test set gives up after this many blocks in a row that add no example not in training
_MAX_MISSES = 20


def check_shape(
    n: int, num_kv_pairs: int, vocab_size: int, power_a: float, prefix: str = ""
) -> None:
    """One line for the first bad setting of the sequences :func:`generate` draws, Zoology's
    constraints: n even and at least :data:`MIN_N`, 4·num_kv_pairs <= n, vocab_size > n and
    able to hold the distinct keys and values, power_a > 0. ``n`` is named as it is (a cell's
    own key), the others ``prefix`` + their name (``quality.mqar.`` for a cell's settings)."""
    n = check_int("n", n, low=MIN_N)
    if n % 2:
        raise ValueError(f"n: must be even (Zoology's constraint), got {n}")
    pairs = check_int(f"{prefix}num_kv_pairs", num_kv_pairs)
    if 4 * pairs > n:
        raise ValueError(
            f"{prefix}num_kv_pairs: must be at most n/4 = {n // 4} for n={n} (the pairs take "
            f"2·num_kv_pairs tokens, each key one of the n/2 - num_kv_pairs query slots left), "
            f"got {num_kv_pairs}"
        )
    v = check_int(f"{prefix}vocab_size", vocab_size)
    if v <= n or min(v // 2 - 1, v - v // 2) < pairs:  # the second is implied by the first
        raise ValueError(
            f"{prefix}vocab_size: must exceed n={n} (Zoology's constraint) and hold "
            f"num_kv_pairs={pairs} distinct keys in [1, vocab_size/2) and values in "
            f"[vocab_size/2, vocab_size), got {vocab_size}"
        )
    check_number(f"{prefix}power_a", power_a, low=0, open_low=True)


def check_settings(
    n: int, *, prefix: str = "", num_kv_pairs: int, vocab_size: int, power_a: float,
    train_examples: int, test_examples: int, seed: int,
) -> None:  # fmt: skip
    """One line for the first bad setting of an MQAR data set at ``n``, in this order, named as
    :func:`check_shape` names them; nothing is drawn before it passes."""
    check_shape(n, num_kv_pairs, vocab_size, power_a, prefix)
    check_int(f"{prefix}train_examples", train_examples)
    check_int(f"{prefix}test_examples", test_examples)
    check_int(f"{prefix}seed", seed, low=0)


def _ordered_distinct(rng: np.random.Generator, rows: int, choices: int, size: int) -> np.ndarray:
    """(rows, size) distinct integers of ``[0, choices)`` per row, a uniform ordered draw
    without replacement. Where repeats are rare (size² <= choices), i.i.d. uniform integers
    with every row that repeats one drawn again (each ordered distinct tuple stays equally
    likely); else the positions of the ``size`` smallest of ``choices`` uniforms, smallest
    first. Both cost little: about rows·size and rows·choices numbers."""
    if size * size > choices:
        u = rng.random((rows, choices))
        pick = np.argpartition(u, size - 1, axis=1)[:, :size]
        order = np.argsort(np.take_along_axis(u, pick, axis=1), axis=1, kind="stable")
        return np.take_along_axis(pick, order, axis=1)
    out = rng.integers(0, choices, size=(rows, size))
    redo = np.arange(rows)
    while True:
        s = np.sort(out[redo], axis=1)
        redo = redo[(s[:, 1:] == s[:, :-1]).any(axis=1)]
        if not len(redo):
            return out
        out[redo] = rng.integers(0, choices, size=(len(redo), size))


def _gaps(rng: np.random.Generator, rows: int, space: int, size: int, power_a: float) -> np.ndarray:
    """(rows, size) distinct slots of ``[0, space)`` per row, successive draws with weights
    (j+1)^(a−1) (Zoology's p, whose constant a·Σ cancels): the ``size`` earliest of exponential
    arrival times of rate p_j, earliest first (compared in logs, so no weight overflows)."""
    arrival = -np.log(1.0 - rng.random((rows, space)))  # Exp(1), finite: 1 - U is in (0, 1]
    with np.errstate(divide="ignore"):  # an arrival of exactly 0 (p = 2^-53) is -inf: first
        score = np.log(arrival) - (power_a - 1.0) * np.log(np.arange(1.0, space + 1.0))
    return np.argsort(score, axis=1, kind="stable")[:, :size]


def _draw(
    rng: np.random.Generator, rows: int, n: int, num_kv_pairs: int, vocab_size: int,
    power_a: float,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``rows`` examples from ``rng`` (inputs, labels), int64 arrays (rows, n), in blocks."""
    pairs, half = num_kv_pairs, vocab_size // 2
    space = n // 2 - pairs
    inputs = np.full((rows, n), FILLER, dtype=np.int64)
    labels = np.full((rows, n), IGNORE, dtype=np.int64)
    block = max(1, _CELLS // max(half, space))
    for at in range(0, rows, block):
        r = slice(at, min(at + block, rows))
        count = r.stop - r.start
        keys = 1 + _ordered_distinct(rng, count, half - 1, pairs)  # [1, V//2)
        values = half + _ordered_distinct(rng, count, vocab_size - half, pairs)  # [V//2, V)
        query = 2 * pairs + 2 * _gaps(rng, count, space, pairs, power_a)  # key i's position
        inputs[r, 0 : 2 * pairs : 2] = keys
        inputs[r, 1 : 2 * pairs : 2] = values
        np.put_along_axis(inputs[r], query, keys, axis=1)
        np.put_along_axis(labels[r], query, values, axis=1)
    return inputs, labels


def generate(
    n_examples: int, *, seed: int, n: int, num_kv_pairs: int, vocab_size: int,
    power_a: float = 0.01,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(inputs, labels), LongTensors (n_examples, n): ``n_examples`` MQAR sequences and their
    labels (the bound value at each query position, :data:`IGNORE` elsewhere).

    Deterministic from ``seed`` (its own ``numpy.random.Generator``; no global state is read
    or changed). Examples are independent draws: two may be equal when the settings allow few
    distinct sequences, as in Zoology.
    """
    check_int("n_examples", n_examples)
    check_int("seed", seed, low=0)
    check_shape(n, num_kv_pairs, vocab_size, power_a)
    rng = np.random.default_rng(seed)
    inputs, labels = _draw(rng, n_examples, n, num_kv_pairs, vocab_size, power_a)
    return torch.from_numpy(inputs), torch.from_numpy(labels)


@dataclass
class Splits:
    """A training and a test set from one seed (inputs and labels, LongTensors (N, n)), their
    sizes, and ``chance``: what guessing one of the example's own P values scores (1/P)."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    train_size: int
    test_size: int
    chance: float


def splits(
    n: int, seed: int, train_examples: int, test_examples: int, *, num_kv_pairs: int,
    vocab_size: int, power_a: float = 0.01,
) -> Splits:  # fmt: skip
    """The training set from the stream ``2·seed``, the test set from ``2·seed + 1`` with every
    training sequence excluded (a test example drawn that is also in training is dropped and
    drawn again), so no example is in both. Unless some are dropped, the test set is
    ``generate(test_examples, seed=2·seed + 1, ...)``. Raises a one-line ``ValueError`` when
    the settings allow too few distinct sequences to find ``test_examples`` new ones."""
    check_settings(
        n, num_kv_pairs=num_kv_pairs, vocab_size=vocab_size, power_a=power_a,
        train_examples=train_examples, test_examples=test_examples, seed=seed,
    )  # fmt: skip
    shape = {"n": n, "num_kv_pairs": num_kv_pairs, "vocab_size": vocab_size, "power_a": power_a}
    x_train, y_train = _draw(np.random.default_rng(2 * seed), train_examples, **shape)
    seen = {row.tobytes() for row in x_train}
    rng = np.random.default_rng(2 * seed + 1)
    xs, ys, have, misses = [], [], 0, 0
    while have < test_examples:
        x, y = _draw(rng, test_examples - have, **shape)
        new = np.fromiter((row.tobytes() not in seen for row in x), dtype=bool, count=len(x))
        xs.append(x[new])
        ys.append(y[new])
        have += int(new.sum())
        misses = 0 if new.any() else misses + 1
        if misses >= _MAX_MISSES:
            raise ValueError(
                f"mqar: found only {have} of {test_examples} test examples not in the "
                f"training set at n={n}, num_kv_pairs={num_kv_pairs}, "
                f"vocab_size={vocab_size}; raise vocab_size or n, or ask for fewer"
            )
    x_test, y_test = np.concatenate(xs), np.concatenate(ys)
    assert not seen & {row.tobytes() for row in x_test}
    return Splits(
        torch.from_numpy(x_train), torch.from_numpy(y_train),
        torch.from_numpy(x_test), torch.from_numpy(y_test),
        train_size=train_examples, test_size=test_examples, chance=1 / num_kv_pairs,
    )  # fmt: skip
