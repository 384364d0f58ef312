"""The incremental (decode) form every mechanism registered with ``cannot_decode=None`` keeps.

A serving engine's prefill is ``extend`` from an empty state (whole or in chunks), its decode
step ``extend`` by one token; together they must equal the causal forward over the whole
sequence, position by position, for a layer and for a model, with any budget and with
grouped-query heads. Left-padded prompts of different lengths: padding never reaches a real
output, even as NaN. ``state_bytes`` is what ``new_state`` allocates; ``step_flops`` what
FlopCounterMode counts for one decode step. The mechanisms come from the registry, so a new
one (a user's too) is held to this without editing the tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import attnbench
from attnbench import registry
from attnbench.attention.base import MultiHeadAttention
from attnbench.attention.vanilla import VanillaAttention
from attnbench.measure.flops import count_flops
from attnbench.model import build_model
from tests.conftest import runnable_here

D, H, FF, N = 32, 4, 64, 40  # N > 32: local's blocked band runs more than one block
BUDGETS = (6, 16, 2 * N)  # below and above the sequence (local's window 6 < N < 80)
FORMS = ("layer", "model")
CPU = torch.device("cpu")
FP64_TOL = 1e-10
# fp32: the worst max |error| measured over every case of the test below (every mechanism,
# budget, kv_heads, form and prefill; seeds 0, 1, 2) was 9.5e-7, in the 2-layer model (a
# single layer: 4.8e-7); 1e-5 leaves a decade for other CPUs' kernels.
FP32_TOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny shapes, thousands of small ops: one thread. With more, each op waits at a
    barrier for every thread, which a busy CPU turns from 7 s into minutes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _chunks(t: int, c: int) -> list[int]:
    return [c] * (t // c) + ([t % c] if t % c else [])


# the prompt's pieces before the one-token steps: whole (1 token, a few, all but the last)
# or in chunks of 4; and the state's capacity: the sequence exactly, or room to spare
PREFILLS = {
    "t=1": ([1], N),
    "t=5": ([5], N),
    f"t={N - 1}": ([N - 1], N),
    f"t=5 capacity={2 * N}": ([5], 2 * N),
    f"t=13 in 4s capacity={2 * N}": (_chunks(13, 4), 2 * N),
    f"t={N - 1} in 4s": (_chunks(N - 1, 4), N),
}


def decoders() -> list[str]:
    """Every mechanism that runs here and says it decodes: the registry's, asked afresh."""
    return [n for n in runnable_here() if attnbench.info(n).cannot_decode is None]


def variants(name: str) -> list[dict[str, Any]]:
    """Causal, at each budget (if it has one), with each kv_heads (if it has grouped heads),
    and with twice the value heads (if it has ``v_heads``: value heads apart from key heads)."""
    i = attnbench.info(name)
    base = {"causal": True} if "causal" in i.params else {}
    budgets = [{}] if i.budget is None else [{i.budget: v} for v in BUDGETS]
    kvs = [{}, {"kv_heads": 2}, {"kv_heads": 1}] if i.gqa else [{}]
    kvs += [{"v_heads": 2 * H}] if "v_heads" in i.params else []
    return [{**base, **b, **g} for b in budgets for g in kvs]


def _ids(v: object) -> str:
    if isinstance(v, dict):
        return "-".join(f"{k}={x}" for k, x in v.items() if k != "causal") or "defaults"
    return str(v)


CASES = [(name, params) for name in decoders() for params in variants(name)]


def build(name: str, params: dict[str, Any], form: str, dtype: torch.dtype) -> torch.nn.Module:
    """One layer (``attnbench.create``) or a 2-layer model (``build_model``), tiny, in eval."""
    if form == "layer":
        m = attnbench.create(name, d_model=D, n_heads=H, max_seq_len=N, **params)
    else:
        m = build_model(name, layers=2, d_model=D, n_heads=H, d_ff=FF, max_seq_len=N, **params)
    return m.eval().to(dtype)


def incremental(
    m: torch.nn.Module,
    x: torch.Tensor,
    pieces: list[int],
    mask: torch.Tensor | None = None,
    capacity: int | None = None,
) -> torch.Tensor:
    """``x`` (b, n, d) through ``m``'s incremental form: the prompt in ``pieces``, each
    extended with its slice of ``mask``, then one token at a time (no mask): (b, n, d)."""
    b, n, _ = x.shape
    state = m.new_state(b, capacity or n, x.dtype, x.device)
    outs, start = [], 0
    prompt = sum(pieces)
    for size in [*pieces, *[1] * (n - prompt)]:
        part = slice(start, start + size)
        piece_mask = None if mask is None or start >= prompt else mask[:, part]
        outs.append(m.extend(x[:, part], state, piece_mask))
        start += size
    return torch.cat(outs, dim=1)


def worst_prefill_then_decode_error(name: str, params: dict, form: str, dtype: torch.dtype) -> dict:
    """Max |incremental − causal forward| over the sequence, for each prefill of PREFILLS."""
    m = build(name, params, form, dtype)
    x = torch.randn(2, N, D, dtype=dtype)
    errors = {}
    with torch.inference_mode():
        want = m(x)
        for label, (pieces, capacity) in PREFILLS.items():
            got = incremental(m, x, pieces, capacity=capacity)
            assert got.shape == want.shape
            errors[label] = (got - want).abs().max().item()
    return errors


# -- 1, 2: prefill then decode steps equal the causal forward ----------------------------------


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("name", "params"), CASES, ids=_ids)
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, FP64_TOL), (torch.float32, FP32_TOL)])
def test_prefill_then_decode_equals_the_causal_forward(
    name: str, params: dict, form: str, dtype: torch.dtype, tol: float
) -> None:
    errors = worst_prefill_then_decode_error(name, params, form, dtype)
    bad = {label: e for label, e in errors.items() if not e < tol}
    assert not bad, f"{name} {params} {form} {dtype}: max |error| over {tol}: {bad}"


# -- 3: left-padded prompts of different lengths ---------------------------------------------

LENGTHS = (9, 5, 1)  # prompts, left-padded to the longest
STEPS = 6  # decode steps after the prompt


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("name", "params"), CASES, ids=_ids)
def test_left_padding_never_reaches_a_real_output(name: str, params: dict, form: str) -> None:
    m = build(name, params, form, torch.float64)
    p = max(LENGTHS)
    x = torch.randn(len(LENGTHS), p + STEPS, D, dtype=torch.float64)
    mask = torch.zeros(x.shape[:2], dtype=torch.bool)
    for i, length in enumerate(LENGTHS):
        mask[i, : p - length] = True
    x[mask] = float("nan")
    with torch.inference_mode():
        for label, pieces in {"whole": [p], "in 4s": _chunks(p, 4)}.items():
            got = incremental(m, x, pieces, mask)
            for i, length in enumerate(LENGTHS):
                real = got[i, p - length :]
                assert not real.isnan().any(), f"{name} {params} {form} {label}: NaN in seq {i}"
                want = m(x[i : i + 1, p - length :])[0]  # the sequence alone, unpadded
                error = (real - want).abs().max().item()
                assert error < FP64_TOL, f"{name} {params} {form} {label} seq {i}: {error}"


# -- 4: state_bytes is what the state holds ----------------------------------------------------


def held_bytes(state: Any) -> int:
    """Bytes of every tensor attribute of a state (or of a model's list of them)."""
    if isinstance(state, list):
        return sum(held_bytes(s) for s in state)
    if dataclasses.is_dataclass(state):
        values = [getattr(state, f.name) for f in dataclasses.fields(state)]
    else:
        values = list(vars(state).values())
    return sum(v.untyped_storage().nbytes() for v in values if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("name", "params"), CASES, ids=_ids)
def test_state_bytes_are_what_the_state_holds(name: str, params: dict, form: str) -> None:
    m = build(name, params, form, torch.float32)
    for dtype in (torch.float32, torch.float16):
        itemsize = dtype.itemsize
        for n in (1, 5, 6, 7, 16, 17, N, 2 * N + 1):  # below, at and above each budget
            held = held_bytes(m.new_state(1, n, dtype, CPU))
            assert m.state_bytes(n, itemsize) == held, (name, params, form, dtype, n)


# -- 5: step_flops is what one decode step runs -----------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("name", "params"), CASES, ids=_ids)
def test_step_flops_agree_with_flop_counter(name: str, params: dict, form: str) -> None:
    m = build(name, params, form, torch.float32)
    b = 3
    for n in (2, 6, 7, 17, N):
        for capacity in (n, N):  # a cache exactly full, and one with room for more tokens
            x = torch.randn(b, n, D)
            with torch.inference_mode():
                state = m.new_state(b, capacity, x.dtype, CPU)
                m.extend(x[:, : n - 1], state)
                counted = count_flops(m.extend, x[:, n - 1 :], state)
            want = m.step_flops(b, n)
            assert want == counted, (
                name,
                params,
                form,
                f"n={n} capacity={capacity}",
                want,
                counted,
            )


# -- 6: refusals, registration, a user's own mechanism ----------------------------------------


@pytest.mark.parametrize(
    "name", [n for n in attnbench.names() if attnbench.info(n).cannot_decode is not None]
)
def test_a_mechanism_that_cannot_decode_says_why_in_one_line(name: str) -> None:
    why = attnbench.info(name).cannot_decode
    assert isinstance(why, str) and why.strip() and "\n" not in why


@dataclass
class _Cfg:
    causal: bool = False


def test_registration_refuses_a_claim_to_decode_it_cannot_keep() -> None:
    class NoState(MultiHeadAttention):
        def attend(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
            return self.v_proj(x)

    class NoExtend(NoState):
        def new_state(self, b: int, capacity: int, dtype: torch.dtype, device: Any) -> Any:
            return None

        def state_bytes(self, n: int, itemsize: int) -> int:
            return 0

    refused = [
        (NoState, True, "does not implement new_state, extend_attend, state_bytes"),
        (NoExtend, True, "does not implement extend_attend$"),
        (VanillaAttention, False, "is not causal"),  # every method, but registered non-causal
    ]
    try:
        for cls, causal, why in refused:
            decorate = attnbench.register(
                "decode_refused_test", config=_Cfg, causal=causal, cannot_decode=None, summary="x"
            )
            with pytest.raises(TypeError, match=why):
                decorate(cls)
            assert "decode_refused_test" not in attnbench.names()
    finally:
        registry._REGISTRY.pop("decode_refused_test", None)


def test_a_users_mechanism_is_held_to_the_same_contract() -> None:
    """A user's causal softmax (vanilla's, under another name and config), registered with
    cannot_decode=None, is among :func:`decoders` and passes the same checks."""
    name = "user_decode_test"

    @attnbench.register(
        name, config=_Cfg, causal=True, gqa=True, cannot_decode=None, summary="a user's"
    )
    class UserSoftmax(VanillaAttention):
        pass

    try:
        assert name in decoders()
        assert variants(name) == [
            {"causal": True, **g} for g in ({}, {"kv_heads": 2}, {"kv_heads": 1})
        ]
        for params in variants(name):
            for form in FORMS:
                test_prefill_then_decode_equals_the_causal_forward(
                    name, params, form, torch.float64, FP64_TOL
                )
                test_left_padding_never_reaches_a_real_output(name, params, form)
                test_state_bytes_are_what_the_state_holds(name, params, form)
                test_step_flops_agree_with_flop_counter(name, params, form)
    finally:
        registry._REGISTRY.pop(name, None)
    assert name not in attnbench.names()


# -- 7: grouped-query heads ------------------------------------------------------------------


def repeated_kv_reference(
    m: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """Plain multi-head softmax attention with each of the layer's own K/V heads repeated
    over its group of query heads (``repeat_interleave``)."""
    b, n, _ = x.shape
    per = m.n_heads // m.kv_heads
    q = m.split_heads(m.q_proj(x))  # (b, h, n, dh)
    k = m.split_heads(m.k_proj(x)).repeat_interleave(per, dim=1)  # (b, h, n, dh)
    v = m.split_heads(m.v_proj(x)).repeat_interleave(per, dim=1)
    scores = (q @ k.transpose(-2, -1)) * m.head_dim**-0.5
    blocked = torch.zeros(b, 1, n, n, dtype=torch.bool)
    if mask is not None:
        blocked |= mask[:, None, None, :]
    if causal:
        blocked |= torch.ones(n, n, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(blocked, float("-inf")).softmax(-1)
    return m.out_proj(m.merge_heads(probs @ v))


GQA = [n for n in runnable_here() if attnbench.info(n).gqa]
# compared in float64 below: a mechanism that compiles its kernel is left to its own tests
# (flex: tests/test_flex.py, in fp32 and eagerly in float64; its compiled CPU kernel refuses
# float64)
GQA_FP64 = [n for n in GQA if not attnbench.info(n).compiles]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grouped_heads_are_k_and_v_repeated(kv_heads: int, causal: bool) -> None:
    x = torch.randn(2, 12, D, dtype=torch.float64)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[1, 9:] = True
    outs = {}
    for name in GQA_FP64:
        torch.manual_seed(7)  # the same weights for every mechanism
        m = attnbench.create(
            name, d_model=D, n_heads=H, max_seq_len=12, kv_heads=kv_heads, causal=causal
        ).to(torch.float64)
        assert m.k_proj.out_features == kv_heads * D // H
        with torch.inference_mode():
            for masked in (None, mask):
                want = repeated_kv_reference(m, x, masked, causal)
                got = m(x, masked)
                error = (got - want).abs().max().item()
                assert error < FP64_TOL, (name, kv_heads, causal, masked is not None, error)
            outs[name] = m(x, mask)
    assert {"vanilla", "sdpa"} <= set(outs)
    torch.testing.assert_close(outs["sdpa"], outs["vanilla"], atol=FP64_TOL, rtol=0)


@pytest.mark.parametrize("name", GQA)
def test_kv_heads_that_do_not_divide_n_heads_are_refused(name: str) -> None:
    for make in (attnbench.create, build_model):
        with pytest.raises(ValueError) as e:
            make(name, d_model=D, n_heads=H, max_seq_len=N, kv_heads=3)
        assert str(e.value).startswith("kv_heads:") and "\n" not in str(e.value)


@pytest.mark.parametrize("name", [n for n in runnable_here() if not attnbench.info(n).gqa])
def test_kv_heads_without_grouped_heads_is_refused(name: str) -> None:
    for make in (attnbench.create, build_model):
        with pytest.raises(ValueError) as e:
            make(name, d_model=D, n_heads=H, max_seq_len=N, kv_heads=2)
        assert str(e.value).startswith("kv_heads:") and "\n" not in str(e.value)
