"""MQAR: the generator against a checker written here, apart from the code under test.

:func:`check_example` reads a sequence as the task defines it (Zoology's construction) and
recomputes every label from the sequence alone: the k v pairs at the start give the binding,
and each later position is either a key, whose label must be its bound value, or the filler,
whose label must be ignored. It shares no code with :mod:`attnbench.quality.mqar`; the gap
distribution is checked against probabilities computed here from Zoology's weights.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnbench.quality import mqar

IGNORE = -100  # what Zoology's labels hold where there is no query


def check_example(x: list[int], y: list[int], pairs: int, vocab: int) -> list[int]:
    """Raise AssertionError at the first thing wrong with one example; return each key's query
    slot j (its query at 2·pairs + 2j), keys in context order."""
    n, half, context = len(x), vocab // 2, 2 * pairs
    assert len(y) == n and n % 2 == 0 and 4 * pairs <= n < vocab
    keys, values = x[0:context:2], x[1:context:2]
    assert all(1 <= k < half for k in keys), f"a key outside [1, {half}): {keys}"
    assert all(half <= v < vocab for v in values), f"a value outside [{half}, {vocab}): {values}"
    assert len(set(keys)) == pairs and len(set(values)) == pairs, "keys or values repeat"
    bound = dict(zip(keys, values, strict=True))
    assert all(label == IGNORE for label in y[:context]), "a label inside the context"
    queried: dict[int, int] = {}
    for t in range(context, n):
        if x[t] in bound:
            assert x[t] not in queried, f"key {x[t]} queried twice"
            assert (t - context) % 2 == 0, f"a query at an odd offset, {t}"
            queried[x[t]] = t
            assert y[t] == bound[x[t]], f"position {t}: label {y[t]}, bound {bound[x[t]]}"
        else:
            assert x[t] == 0, f"position {t}: {x[t]} is neither a key nor the filler"
            assert y[t] == IGNORE, f"position {t}: a label without a query"
    assert set(queried) == set(keys), "a key never queried"
    for key, t in queried.items():  # the answer is never to the right of its query
        assert bound[key] not in x[t:], f"key {key}'s value appears after its query"
    return [(queried[k] - context) // 2 for k in keys]


def check_all(x: torch.Tensor, y: torch.Tensor, pairs: int, vocab: int) -> np.ndarray:
    """Every example checked; (examples, pairs) query slots."""
    assert x.dtype == y.dtype == torch.long and x.shape == y.shape
    rows = zip(x.tolist(), y.tolist(), strict=True)
    return np.array([check_example(a, b, pairs, vocab) for a, b in rows])


SHAPES = [  # (n, pairs, vocab, power_a): defaults, the edges of Zoology's constraints, a = 1
    (64, 8, 2048, 0.01),
    (64, 16, 65, 0.01),  # 4·pairs = n (every slot used), vocab = n + 1
    (4, 1, 5, 0.01),  # the smallest task
    (128, 8, 8192, 1.0),
    (66, 3, 100, 3.0),
]


@pytest.mark.parametrize(("n", "pairs", "vocab", "a"), SHAPES)
def test_every_label_recomputed_from_the_sequence(n, pairs, vocab, a):
    x, y = mqar.generate(300, seed=3, n=n, num_kv_pairs=pairs, vocab_size=vocab, power_a=a)
    assert x.shape == (300, n)
    slots = check_all(x, y, pairs, vocab)
    assert (slots >= 0).all() and (slots < n // 2 - pairs).all()
    assert int((y != IGNORE).sum()) == 300 * pairs  # labels only at the queries


def test_the_documented_example_and_determinism():
    x, y = mqar.generate(1, seed=1, n=16, num_kv_pairs=2, vocab_size=20)
    assert x.tolist() == [[7, 10, 9, 11, 0, 0, 7, 0, 9, 0, 0, 0, 0, 0, 0, 0]]  # the docstring's
    assert y[0, 6] == 10 and y[0, 8] == 11 and int((y != IGNORE).sum()) == 2
    state, torch_state = np.random.get_state(), torch.get_rng_state()
    a = mqar.generate(500, seed=7, n=64, num_kv_pairs=8, vocab_size=2048)
    b = mqar.generate(500, seed=7, n=64, num_kv_pairs=8, vocab_size=2048)
    c = mqar.generate(500, seed=8, n=64, num_kv_pairs=8, vocab_size=2048)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert (a[0] != c[0]).any(dim=1).all()  # another seed: every example differs
    assert np.array_equal(np.random.get_state()[1], state[1])  # no global state touched
    assert torch.equal(torch.get_rng_state(), torch_state)


def test_splits_are_the_two_streams_and_disjoint():
    shape = {"num_kv_pairs": 4, "vocab_size": 300}
    s = mqar.splits(32, 2, 400, 100, **shape)
    assert (s.train_size, s.test_size, s.chance) == (400, 100, 0.25)
    train = mqar.generate(400, seed=4, n=32, **shape)
    test = mqar.generate(100, seed=5, n=32, **shape)
    assert torch.equal(s.x_train, train[0]) and torch.equal(s.y_train, train[1])
    assert torch.equal(s.x_test, test[0]) and torch.equal(s.y_test, test[1])
    check_all(s.x_test, s.y_test, 4, 300)
    # n=4, one pair, vocab 5: one key, three values, one slot: three sequences in all
    tiny = {"num_kv_pairs": 1, "vocab_size": 5}
    s = mqar.splits(4, 0, 1, 6, **tiny)
    assert len(s.x_test) == 6 and not (s.x_test == s.x_train[0]).all(dim=1).any()
    with pytest.raises(ValueError, match=r"^mqar: found only 0 of 1 test examples") as e:
        mqar.splits(4, 0, 60, 1, **tiny)  # the training set holds all three
    assert "\n" not in str(e.value)


def _first_two(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distributions of the first and second of successive draws without replacement
    with weights p: p itself, and P(second = y) = Σ_{x≠y} p_x p_y / (1 − p_x)."""
    first = p[:, None] * p[None, :] / (1 - p[:, None])  # [x, y]: x first, then y
    np.fill_diagonal(first, 0.0)
    return p, first.sum(axis=0)


def _misfit(slots: np.ndarray, space: int, a: float) -> float:
    """The largest |z| of the shares of key 0's and key 1's slots at or below a few cut-offs
    against their exact probabilities under Zoology's weights p_j ∝ a·(j+1)^(a−1), with the
    binomial sd. The exact discrete CDF, not the continuous (g/G)^a: at a = 0.01 that would
    put 97 % of the mass on the first slot, where p puts 26 % (p ∝ ~1/g, a harmonic sum)."""
    w = a * np.arange(1, space + 1) ** (a - 1)
    worst = 0.0
    for key, dist in enumerate(_first_two(w / w.sum())):
        for cut in (0, 2, 7, space // 2):
            expect = dist[: cut + 1].sum()
            share = (slots[:, key] <= cut).mean()
            sd = math.sqrt(expect * (1 - expect) / len(slots))
            worst = max(worst, abs(share - expect) / sd)
    return worst


def test_gaps_follow_zoologys_power_law():
    n, pairs, space = 64, 8, 24
    x, y = mqar.generate(4000, seed=11, n=n, num_kv_pairs=pairs, vocab_size=2048, power_a=0.01)
    slots = check_all(x, y, pairs, 2048)
    assert _misfit(slots, space, 0.01) < 5
    assert (slots[:, 0] == 0).mean() == pytest.approx(0.26, abs=0.03)  # most queries come early
    # a = 1 is uniform: each slot is one of the P drawn with probability P / space
    x, y = mqar.generate(4000, seed=12, n=n, num_kv_pairs=pairs, vocab_size=2048, power_a=1.0)
    uniform = check_all(x, y, pairs, 2048)
    assert _misfit(uniform, space, 1.0) < 5
    hits = np.bincount(uniform.ravel(), minlength=space) / len(uniform)
    sd = math.sqrt(pairs / space * (1 - pairs / space) / len(uniform))
    assert np.abs(hits - pairs / space).max() < 5 * sd
    # the check can fail: uniform gaps are far from a = 0.01's
    assert _misfit(uniform, space, 0.01) > 20


def _corrupt(kind: str) -> tuple[list[int], list[int]]:
    x, y = mqar.generate(1, seed=5, n=32, num_kv_pairs=4, vocab_size=100)
    x, y = x[0].tolist(), y[0].tolist()
    check_example(x, y, 4, 100)  # valid before the corruption
    queries = [t for t in range(8, 32) if y[t] != IGNORE]
    q, r = queries[0], queries[1]
    if kind == "swap labels":
        y[q], y[r] = y[r], y[q]
    elif kind == "value after its query":
        x[q + 1] = y[q]
    elif kind == "a key queried twice":
        x[r], y[r] = x[q], y[q]
    elif kind == "a label on a filler":
        y[q + 1] = y[q]
    elif kind == "a repeated value":
        x[3] = x[1]
    return x, y


@pytest.mark.parametrize(
    "kind",
    [
        "swap labels",
        "value after its query",
        "a key queried twice",
        "a label on a filler",
        "a repeated value",
    ],
)
def test_the_checker_catches_a_corrupted_example(kind):
    x, y = _corrupt(kind)
    with pytest.raises(AssertionError):
        check_example(x, y, 4, 100)


GOOD = {k: v for k, v in mqar.DEFAULTS.items() if k != "n"}
BAD = [  # (n, a setting's bad value, the start of the one line)
    (63, {}, "n: must be even (Zoology's constraint), got 63"),
    (2, {}, "n: must be an integer >= 4, got 2"),
    (64.0, {}, "n: must be an integer"),
    (64, {"num_kv_pairs": 20}, "num_kv_pairs: must be at most n/4 = 16 for n=64"),
    (64, {"num_kv_pairs": 0}, "num_kv_pairs: must be an integer >= 1"),
    (64, {"vocab_size": 50}, "vocab_size: must exceed n=64 (Zoology's constraint) and hold"),
    (64, {"vocab_size": 64}, "vocab_size: must exceed n=64"),
    (64, {"vocab_size": "2048"}, "vocab_size: must be an integer"),
    (64, {"power_a": 0}, "power_a: must be a number > 0, got 0"),
    (64, {"power_a": -1.0}, "power_a: must be a number > 0"),
    (64, {"power_a": float("nan")}, "power_a: must be a number > 0"),
    (64, {"power_a": True}, "power_a: must be a number > 0"),
    (64, {"train_examples": 0}, "train_examples: must be an integer >= 1"),
    (64, {"test_examples": -3}, "test_examples: must be an integer >= 1"),
    (64, {"seed": -1}, "seed: must be an integer >= 0"),
]


@pytest.mark.parametrize(("n", "change", "line"), BAD)
def test_a_bad_setting_is_one_line_naming_it(n, change, line):
    with pytest.raises(ValueError) as e:
        mqar.check_settings(n, **{**GOOD, **change})
    assert str(e.value).startswith(line) and "\n" not in str(e.value)
    key = line.split(":")[0]
    with pytest.raises(ValueError) as e:  # a cell's settings: its quality keys prefixed
        mqar.check_settings(n, prefix="quality.mqar.", **{**GOOD, **change})
    assert str(e.value).startswith(key if key == "n" else f"quality.mqar.{key}")
    if key not in ("train_examples", "test_examples", "seed"):  # the generator's own keys
        given = {**GOOD, **change}
        shape = {k: given[k] for k in ("num_kv_pairs", "vocab_size", "power_a")}
        with pytest.raises(ValueError, match=f"^{key}:"):
            mqar.generate(2, seed=0, n=n, **shape)
        with pytest.raises(ValueError, match=f"^{key}:"):
            mqar.splits(n, 0, 2, 2, **shape)


def test_the_defaults_pass():
    mqar.check_settings(**mqar.DEFAULTS)
