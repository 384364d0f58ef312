"""ListOps: the generator against independent references, and the classifier's training run.

The references are written here, apart from the code under test: an evaluator that turns the
tokens into a Python expression and ``eval``s it (numpy's median as LRA takes it), a
transcription of LRA's sampling procedure (nested lists, drawn with the same calls of
``random``), and stack counts of depth and arguments.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnbench
from attnbench.quality import listops
from attnbench.quality.classify import DEFAULTS, Classifier, train

OPS = {"[MAX": "mx(", "[MIN": "mn(", "[MED": "md(", "[SM": "sm("}


def reference_value(tokens: list[str]) -> int:
    """The expression as Python source, ``eval``ed: ``[MAX 2 [SM 5 6 ] ]`` → ``mx(2,sm(5,6,),)``."""
    source = "".join(OPS[t] if t in OPS else ")," if t == "]" else f"{int(t)}," for t in tokens)
    funcs = {
        "mx": lambda *a: max(a),
        "mn": lambda *a: min(a),
        "md": lambda *a: int(np.median(a)),  # LRA's own definition, numpy's rounding
        "sm": lambda *a: sum(a) % 10,
    }
    (value,) = eval(f"({source})", {"__builtins__": {}}, funcs)
    return value


def shape(tokens: list[str]) -> tuple[int, list[int]]:
    """(deepest leaf's depth, root = 1; every operator's argument count), by a stack."""
    depth, deepest, counts, stack = 0, 0, [], []
    for t in tokens:
        if t.startswith("["):
            if stack:
                stack[-1] += 1
            stack.append(0)
            depth += 1
        elif t == "]":
            counts.append(stack.pop())
            depth -= 1
        else:
            if stack:
                stack[-1] += 1
            deepest = max(deepest, depth + 1)
    return deepest, counts


def lra_stream(seed: int, count: int, min_len: int, max_len: int, depth: int, args: int):
    """LRA's main loop, transcribed: draw trees with LRA's calls of ``random`` in LRA's order
    (the operator drawn after its children), keep distinct ones within the lengths."""
    rng = random.Random(seed)

    def tree(d: int) -> tuple[object, int]:
        if (rng.random() if d < depth else 1) > 0.25:
            return rng.choice(range(10)), 1
        children = [tree(d + 1) for _ in range(rng.randint(2, args))]
        op = rng.choice(["[MAX", "[MIN", "[MED", "[SM"])
        return [op, *(c for c, _ in children)], 2 + sum(n for _, n in children)

    def flat(t: object) -> list[str]:
        if isinstance(t, int):
            return [str(t)]
        return [t[0], *(tok for child in t[1:] for tok in flat(child)), "]"]

    seen, out = set(), []
    while len(out) < count:
        t, n = tree(1)
        tokens = flat(t)
        assert len(tokens) == n
        if min_len <= n <= max_len and tuple(tokens) not in seen:
            seen.add(tuple(tokens))
            out.append(tokens)
    return out


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("[MED 1 2 ]", 1),  # np.median 1.5 -> int 1
        ("[MED 3 4 5 6 ]", 4),  # 4.5 -> 4
        ("[MED 9 0 8 ]", 8),
        ("[SM 9 8 7 ]", 4),  # 24 mod 10
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[MIN [MAX 1 2 ] [SM 5 6 ] 3 ]", 1),
        ("[SM [MED 2 7 ] [MAX 0 3 ] ]", 7),  # 4 + 3
        ("5", 5),
    ],
)
def test_evaluate_by_hand(text: str, value: int) -> None:
    tokens = text.split()
    assert listops.evaluate(tokens) == value
    assert reference_value(tokens) == value


def test_answers_match_an_independent_evaluator() -> None:
    examples = listops.generate(400, seed=3, min_len=20, max_len=120)
    for tokens, label in examples:
        assert label == reference_value(tokens)
    # MED with an even count happens in these, so the rounding rule was exercised
    assert any("[MED" in t for t, _ in examples)


def test_the_trees_are_lras() -> None:
    """At lengths that never cut a subtree short (max_depth=4, max_args=3: at most 53
    tokens), the examples are exactly LRA's procedure's, drawn from the same seed."""
    ours = listops.generate(300, seed=11, min_len=8, max_len=53, max_depth=4, max_args=3)
    assert [t for t, _ in ours] == lra_stream(11, 300, 8, 53, 4, 3)


@pytest.mark.parametrize(("max_depth", "max_args"), [(3, 3), (5, 2), (10, 10)])
def test_depth_and_argument_limits(max_depth: int, max_args: int) -> None:
    examples = listops.generate(300, seed=1, min_len=5, max_len=200, max_depth=max_depth,
                                max_args=max_args)  # fmt: skip
    deepest, counts = zip(*(shape(t) for t, _ in examples), strict=True)
    assert max(deepest) <= max_depth and min(deepest) >= 2
    assert all(2 <= c <= max_args for cs in counts for c in cs)
    if max_depth <= 5:  # the limits are reached, not just respected
        assert max(deepest) == max_depth
        assert max(c for cs in counts for c in cs) == max_args


def test_lengths_determinism_and_seeds() -> None:
    a = listops.generate(200, seed=5, min_len=30, max_len=90)
    assert all(30 <= len(t) <= 90 for t, _ in a)
    assert len({tuple(t) for t, _ in a}) == 200  # distinct, as LRA's set
    assert a == listops.generate(200, seed=5, min_len=30, max_len=90)
    b = listops.generate(200, seed=6, min_len=30, max_len=90)
    assert not {tuple(t) for t, _ in a} & {tuple(t) for t, _ in b}


def test_exclude_keeps_sets_apart() -> None:
    """In a small space (one operator over two digits: 400 expressions) the same seed would
    redraw what is excluded; ``exclude`` stops it."""
    kw = {"min_len": 4, "max_len": 4, "max_depth": 2, "max_args": 2}
    first = listops.generate(100, seed=0, **kw)
    second = listops.generate(100, seed=0, exclude=[t for t, _ in first], **kw)
    assert not {tuple(t) for t, _ in first} & {tuple(t) for t, _ in second}
    with pytest.raises(ValueError, match="found only 400 of 401"):
        listops.generate(401, seed=0, **kw)


def test_label_distribution() -> None:
    """Ten classes, none dominant: LRA's tree distribution at CPU lengths puts ~16 % on the
    most common label (0 or 9: MIN and MAX of many digits)."""
    examples = listops.generate(1000, seed=0, min_len=64, max_len=256)
    counts = Counter(reference_value(t) for t, _ in examples)
    assert set(counts) == set(range(10))
    share = max(counts.values()) / len(examples)
    assert 0.12 < share < 0.22
    assert counts.most_common(1)[0][0] in (0, 9)


def test_vocab_and_encode() -> None:
    assert listops.VOCAB["<pad>"] == 0
    assert sorted(listops.VOCAB.values()) == list(range(16))
    ex = [("[MAX 2 9 ]".split(), 9), ("[SM 9 8 7 4 ]".split(), 8)]
    ids, mask, labels = listops.encode(ex, 8)
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == (2, 8)
    assert mask.sum(1).tolist() == [4, 2]
    assert ids[0, :4].tolist() == [listops.VOCAB[t] for t in ex[0][0]]
    assert (ids[mask] == 0).all() and labels.tolist() == [9, 8]
    with pytest.raises(ValueError, match=r"^n: must be at least 6"):
        listops.encode(ex, 5)


def test_bad_input_is_one_line() -> None:
    tiny = {"steps": 1, "train_examples": 4, "test_examples": 4}
    with pytest.raises(ValueError, match=r"^n: must be at least 16 for listops") as e:
        train("vanilla", n=8, **tiny)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^attention: must be a registered mechanism") as e:
        train("nonesuch", n=32, **tiny)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^n: must be at least 64 for listops"):
        listops.check_n(32, max_len=64)
    # no expression of 20 tokens at depth 3 (at most 17): the depth that has one is named
    with pytest.raises(ValueError, match=r"^max_depth: must be at least 4 at max_args=3, so"):
        listops.generate(1, seed=0, min_len=20, max_len=30, max_depth=3, max_args=3)
    with pytest.raises(ValueError, match=r"^quality.listops.max_args: must be an integer >= 2"):
        listops.check_shape(4, 16, 3, 1, prefix="quality.listops.")
    with pytest.raises(ValueError, match=r"^tokens: unknown token"):
        listops.evaluate(["[MAX", "x", "]"])
    with pytest.raises(ValueError, match=r"^tokens: "):
        listops.evaluate(["[MAX", "1", "2"])


TINY = {
    "n": 32, "steps": 6, "batch": 8, "lr": 3e-3, "warmup": 2, "layers": 1, "d_model": 16,
    "n_heads": 2, "d_ff": 32, "train_examples": 64, "test_examples": 40, "eval_every": 3,
}  # fmt: skip


@pytest.mark.parametrize(("attention", "params"), [("vanilla", {}), ("linformer", {"k": 8})])
def test_tiny_run_end_to_end(attention: str, params: dict) -> None:
    r = train(attention, params, seed=1, **TINY)
    assert 0 <= r["test_accuracy"] <= 1
    assert r["curve"] == [(3, r["curve"][0][1]), (6, r["test_accuracy"])]
    test_set = listops.generate(
        40,
        seed=3,
        min_len=8,
        max_len=32,
        exclude=(t for t, _ in listops.generate(64, seed=2, min_len=8, max_len=32)),
    )  # (the test stream of seed 1, recounted here)
    labels = Counter(label for _, label in test_set)
    assert r["majority_accuracy"] == max(labels.values()) / 40
    ids, mask, _ = listops.encode(test_set, 32)  # what the hidden-state studies are given
    assert all(torch.equal(a, b) for a, b in zip(r["test_inputs"], (ids, mask), strict=True))
    assert r["steps_per_s"] > 0 and r["peak_bytes"] > 0
    assert (r["train_examples"], r["test_examples"]) == (64, 40)
    model = r["model"]
    assert isinstance(model, Classifier) and not model.training
    assert isinstance(model.encoder, attnbench.model.Encoder)
    ids, mask, _ = listops.encode(listops.generate(2, seed=9, min_len=8, max_len=32), 32)
    assert model.embed(ids).shape == (2, 32, 16)
    assert model(ids, mask).shape == (2, 10)


def test_determinism_under_a_seed() -> None:
    a, b = train("vanilla", seed=4, **TINY), train("vanilla", seed=4, **TINY)
    assert a["curve"] == b["curve"]
    for (k, x), (_, y) in zip(a["model"].state_dict().items(), b["model"].state_dict().items(),
                              strict=True):  # fmt: skip
        assert torch.equal(x, y), k
    c = train("vanilla", seed=5, **TINY)
    assert not torch.equal(a["model"].head.weight, c["model"].head.weight)


def test_loss_decreases_on_a_trivial_task() -> None:
    """Label = the root operator (MAX 0, MIN 1, MED 2, SM 3): one token at position 0."""
    torch.manual_seed(0)
    examples = listops.generate(64, seed=0, min_len=8, max_len=32)
    ids, mask, _ = listops.encode(examples, 32)
    target = ids[:, 0] - listops.VOCAB["[MAX"]
    model = Classifier("vanilla", vocab=16, n=32, layers=1, d_model=16, n_heads=2, d_ff=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = F.cross_entropy(model(ids, mask), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]


def test_mean_pool_ignores_padding() -> None:
    """The padded batch's logits equal each sequence run alone, unpadded, and do not move
    when the padded positions' ids change."""
    torch.manual_seed(0)
    model = Classifier("vanilla", vocab=16, n=32, layers=2, d_model=16, n_heads=2, d_ff=32).eval()
    examples = listops.generate(3, seed=2, min_len=5, max_len=30)
    ids, mask, _ = listops.encode(examples, 32)
    with torch.no_grad():
        padded = model(ids, mask)
        garbage = ids.masked_fill(mask, listops.VOCAB["7"])
        torch.testing.assert_close(model(garbage, mask), padded, rtol=0, atol=1e-6)
        for i, (tokens, _) in enumerate(examples):
            alone = model(ids[i : i + 1, : len(tokens)])
            torch.testing.assert_close(alone[0], padded[i], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(model(garbage), padded, atol=1e-3)  # the mask matters


def test_defaults_are_lras_rules() -> None:
    assert (DEFAULTS["max_depth"], DEFAULTS["max_args"]) == (10, 10)
    assert set(DEFAULTS) <= set(train.__code__.co_varnames)
