"""ListOps as Long Range Arena generates it, from a seed, with no download.

An example is a prefix expression over the digits 0–9, e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]``
(value 9); its value, 0–9, is the label (10 classes). Four operators, as LRA's
``lra_benchmarks/data/listops.py`` (its ``OPERATORS``; FIRST and LAST are commented out there):

* ``[MAX``, ``[MIN`` — the largest, the smallest argument;
* ``[MED`` — ``int(np.median(args))``: with an even count numpy averages the two middle
  values and ``int`` truncates, so for these non-negative digits it is the *floor* of that
  mean (``[MED 1 2 ]`` is 1, ``[MED 3 4 5 6 ]`` is 4);
* ``[SM`` — the sum modulo 10.

The tree is drawn as LRA's ``generate_tree`` draws it, with the same calls in the same order
on a private ``random.Random(seed)``: a node at depth ``d < max_depth`` is an operator with
probability 0.25 (``VALUE_P``), else a digit; a node at ``max_depth`` is always a digit; an
operator takes ``randint(2, max_args)`` children, drawn before the operator itself. The root
is at depth 1, so leaves lie at depth ≤ ``max_depth`` and operators nest at most
``max_depth - 1`` deep. The length is LRA's: one token per digit, two per operator (it and its
``]``). Examples outside the length bounds are rejected and duplicates dropped, as LRA's main
loop does (it keeps a ``set`` of trees).

Kept from LRA: the operators, the tree distribution (``VALUE_P``, the argument counts, the
depth rule), ``max_depth=10`` and ``max_args=10`` as defaults, length by rejection, no
duplicates. Differences, each for a reason:

* Lengths: LRA keeps 500 < length < 2000 (strict); :func:`generate` takes any bounds,
  inclusive. A CPU run uses LRA's ratio at a smaller scale (``[n/4, n]``, e.g. 64–256 tokens
  at n = 256) because attention at n = 2000 on 2 cores trains a few steps a minute.
* Tokens: LRA's TSV writes each subtree in parentheses, ``( ( [MAX 2 ) 9 )``; the parentheses
  repeat what the brackets already say, so they are left out and the tokens are exactly what
  LRA's length counts.
* An operator's subtree is abandoned as soon as the expression is longer than ``max_len``:
  such a tree would be rejected anyway, so the accepted examples have the same distribution
  and generation is quicker (the random stream then differs from a run without the cut).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnbench.validators import check_int

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
END = "]"
DIGITS = tuple(str(v) for v in range(10))
VALUE_P = 0.25  # LRA: a node below max_depth is an operator with this probability
PAD = "<pad>"
# token -> id; 0 is padding (an embedding's padding_idx), so a zero-filled tensor is padding
VOCAB: dict[str, int] = {tok: i for i, tok in enumerate((PAD, *OPERATORS, END, *DIGITS))}
N_CLASSES = 10
# the shortest n a run may ask for: at n = 16 the lengths [n/4, n] are 4–16, still a
# one- or two-operator expression; shorter leaves almost nothing to generate
MIN_N = 16
# rejection gives up after this many trees in a row without a new example (~0.3 s): the
# lengths asked for are (nearly) impossible, or every distinct expression is drawn already
_MAX_MISSES = 100_000


class _TooLong(Exception):
    """Raised inside the recursion once the expression exceeds ``max_len``."""


def _longest(max_depth: int, max_args: int, cap: int) -> int:
    """The longest expression the rules allow (1 at max_depth, 2 + max_args·(below) above),
    counted up to ``cap`` (beyond it, the exact figure does not matter)."""
    longest = 1
    for _ in range(max_depth - 1):
        longest = min(2 + max_args * longest, cap)
    return longest


def check_shape(
    min_len: int, max_len: int, max_depth: int, max_args: int, prefix: str = ""
) -> None:
    """One line for the first bad limit of the expressions :func:`generate` draws, named
    ``prefix`` + its name (``quality.listops.`` for a cell's settings, checked before any
    cell runs). Limits under which no expression reaches ``min_len`` tokens are refused by
    naming the depth that would: rejection would otherwise draw for ever."""
    check_int(f"{prefix}min_len", min_len)
    check_int(f"{prefix}max_len", max_len, low=min_len)
    check_int(f"{prefix}max_depth", max_depth, low=2)  # depth 1 is a lone digit: no expression
    check_int(f"{prefix}max_args", max_args, low=2)
    least = 2  # the longest expression grows with the depth until it passes max_len
    while _longest(least, max_args, max_len + 1) < min_len:
        least += 1
    if max_depth < least:
        raise ValueError(
            f"{prefix}max_depth: must be at least {least} at max_args={max_args}, so that an "
            f"expression can reach min_len={min_len} tokens (at most "
            f"{_longest(max_depth, max_args, max_len + 1)} at max_depth={max_depth}); "
            f"got {max_depth}"
        )


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int, out: list[str], cap: int):
    """Append one subtree's tokens to ``out``; LRA's draws, in LRA's order."""
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        out.append(str(rng.choice(range(10))))
        if len(out) > cap:
            raise _TooLong
        return
    at = len(out)
    out.append("")  # the operator, drawn after its children as LRA draws it
    for _ in range(rng.randint(2, max_args)):
        _tree(rng, depth + 1, max_depth, max_args, out, cap)
    out[at] = rng.choice(OPERATORS)
    out.append(END)
    if len(out) > cap:
        raise _TooLong


def generate(
    n_examples: int,
    *,
    seed: int,
    min_len: int,
    max_len: int,
    max_depth: int = 10,
    max_args: int = 10,
    exclude: Iterable[Sequence[str]] = (),
) -> list[tuple[list[str], int]]:
    """``n_examples`` distinct (tokens, label) pairs, ``min_len <= len(tokens) <= max_len``.

    Deterministic from ``seed``. ``exclude`` lists token sequences that must not be drawn (a
    training set, when drawing its test set: no example in both).
    """
    check_int("n_examples", n_examples)
    check_int("seed", seed, low=0)
    check_shape(min_len, max_len, max_depth, max_args)
    rng = random.Random(seed)
    seen = {tuple(t) for t in exclude}
    out: list[tuple[list[str], int]] = []
    misses = 0
    while len(out) < n_examples:
        misses += 1
        if misses > _MAX_MISSES:
            raise ValueError(
                f"listops: found only {len(out)} of {n_examples} distinct expressions with "
                f"{min_len} <= length <= {max_len}, max_depth={max_depth}, "
                f"max_args={max_args}; widen the lengths or ask for fewer"
            )
        tokens: list[str] = []
        try:
            _tree(rng, 1, max_depth, max_args, tokens, max_len)
        except _TooLong:
            continue
        key = tuple(tokens)
        if len(tokens) < min_len or key in seen:
            continue
        seen.add(key)
        out.append((tokens, evaluate(tokens)))
        misses = 0
    return out


def _apply(op: str, args: list[int]) -> int:
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    if op == "[SM":
        return sum(args) % 10
    s = sorted(args)  # [MED: int(np.median(args)), the floor of the middle pair's mean
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2


def evaluate(tokens: Sequence[str]) -> int:
    """The value (0–9) of one expression: a stack of open operators and their arguments.

    Raises ``ValueError`` on a malformed expression (an unknown token, an unbalanced ``]``,
    an operator without arguments, anything after the root).
    """
    stack: list[tuple[str, list[int]]] = []
    value: int | None = None
    for i, tok in enumerate(tokens):
        if value is not None and not stack:
            raise ValueError(f"tokens: the expression ends before token {i} ({tok!r})")
        if tok in OPERATORS:
            stack.append((tok, []))
            continue
        if tok == END:
            if not stack or not stack[-1][1]:
                raise ValueError(f"tokens: unbalanced or empty ']' at {i}")
            op, args = stack.pop()
            v = _apply(op, args)
        elif tok in DIGITS:
            v = int(tok)
        else:
            raise ValueError(f"tokens: unknown token {tok!r} at {i}")
        if stack:
            stack[-1][1].append(v)
        else:
            value = v
    if value is None or stack:
        raise ValueError("tokens: an incomplete expression")
    return value


def check_n(n: int, max_len: int | None = None) -> int:
    """``n`` if a ListOps run can use it: at least :data:`MIN_N` and at least the longest
    expression (``max_len``), since an expression cut short has another value."""
    n = check_int("n", n)
    least = max(MIN_N, max_len or 0)
    if n < least:
        why = f"the longest expression, max_len={max_len}" if least == max_len else "MIN_N"
        raise ValueError(f"n: must be at least {least} for listops ({why}), got {n}")
    return n


def encode(examples: Sequence[tuple[Sequence[str], int]], n: int) -> tuple[Tensor, Tensor, Tensor]:
    """(ids LongTensor (N, n), mask BoolTensor (N, n) True = padding, labels LongTensor (N,)).

    Each expression is left-aligned and padded with id 0 to ``n``; one longer than ``n`` is an
    error, never truncated (a truncated expression has no value).
    """
    check_int("n", n)
    ids = torch.zeros(len(examples), n, dtype=torch.long)
    labels = torch.empty(len(examples), dtype=torch.long)
    for i, (tokens, label) in enumerate(examples):
        if len(tokens) > n:
            raise ValueError(f"n: must be at least {len(tokens)} (example {i}'s length), got {n}")
        ids[i, : len(tokens)] = torch.tensor([VOCAB[t] for t in tokens], dtype=torch.long)
        labels[i] = check_int("label", label, low=0, high=N_CLASSES - 1)
    return ids, ids == 0, labels


@dataclass
class Splits:
    """A training and a test set from one seed, encoded (:func:`encode`), with their sizes
    and the test set's majority-class share (what predicting one class scores)."""

    x_train: Tensor
    m_train: Tensor
    y_train: Tensor
    x_test: Tensor
    m_test: Tensor
    y_test: Tensor
    train_size: int
    test_size: int
    majority: float


def splits(
    n: int, seed: int, train_examples: int, test_examples: int, **expressions: int
) -> Splits:
    """The training set from the stream ``2·seed``, the test set from ``2·seed + 1`` with
    every training expression excluded (so no example is in both), both padded to ``n``;
    ``expressions`` go to :func:`generate` (its lengths, depth and arguments)."""
    train_set = generate(train_examples, seed=2 * seed, **expressions)
    test_set = generate(
        test_examples, seed=2 * seed + 1, exclude=(t for t, _ in train_set), **expressions
    )
    assert not {tuple(t) for t, _ in train_set} & {tuple(t) for t, _ in test_set}
    x_train, m_train, y_train = encode(train_set, n)
    x_test, m_test, y_test = encode(test_set, n)
    return Splits(
        x_train, m_train, y_train, x_test, m_test, y_test,
        train_size=len(train_set), test_size=len(test_set),
        majority=Counter(y_test.tolist()).most_common(1)[0][1] / len(y_test),
    )  # fmt: skip
