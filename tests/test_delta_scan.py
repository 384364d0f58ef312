"""The (gated) delta rule's core (attention/delta_scan.py), DeltaNet (g None) and Gated DeltaNet
(g given), held to issue #33 item 3: chunked = reference in float64, prefill + decode = the
whole, no future leak, gradients, fp32 within a stated tolerance, padding changes no state.

Keys are L2-normalised here, as the layers will (the core does not), β ∈ (0, 1) and
g = log α ≤ 0. Float64 residuals as measured on this machine (b = 2, h = 3, dk = 4, dv = 5,
a random initial state), DeltaNet / gated: chunked against the reference over n ∈ {1, 5, 16,
37} and chunks 1, 8, 64, at most 7.2e-15 / 1.8e-15 on the output and 1.3e-15 / 7.2e-16 on
the final state; prefill by the chunked form then delta_step token by token against the
reference, 2.2e-15 / 1.8e-15; every input's gradient, chunked against the reference
(b = 1, h = 2, n = 11, dk = 3, chunk 4), 4.4e-15 / 2.7e-15. All asserted below 1e-13. fp32
chunked against the float64 reference at n = 256, chunk 64, dk = dv = 16: 4.3e-6 / 2.3e-6 on
outputs up to 18.2 / 12.7 (2.3e-7 / 1.8e-7 of the largest), 7.5e-7 / 4.6e-7 on states up to
2.1 / 0.86 (3.6e-7 / 5.3e-7); asserted within 1e-5 of the largest.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.nn.functional import logsigmoid, normalize

from attnbench.attention.delta_scan import (
    delta_chunked,
    delta_reference,
    delta_step,
    state_elements,
)

B, H, DK, DV = 2, 3, 4, 5
F64 = torch.float64


def inputs(
    n: int, gated: bool, *, b: int = B, h: int = H, dk: int = DK, dv: int = DV, seed: int = 0
) -> dict[str, Tensor | None]:
    """q, k (unit), v, beta ∈ (0, 1), g ≤ 0 (None if not gated), initial_state; float64."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=F64)

    return {
        "q": r(b, h, n, dk),
        "k": normalize(r(b, h, n, dk), dim=-1),
        "v": r(b, h, n, dv),
        "beta": torch.sigmoid(r(b, h, n)),
        "g": logsigmoid(r(b, h, n) + 2) if gated else None,
        "initial_state": r(b, h, dk, dv),
    }


def core_args(x: dict[str, Tensor | None]) -> tuple[tuple, dict]:
    """(q, k, v, beta, g), {initial_state}: the positional and keyword arguments of a core."""
    return (x["q"], x["k"], x["v"], x["beta"], x["g"]), {"initial_state": x["initial_state"]}


def max_diff(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item()


GATED = pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])


# --- the oracle itself -----------------------------------------------------------------------


@GATED
def test_a_full_write_under_a_unit_key_is_read_back_exactly(gated: bool) -> None:
    """β = 1 and ‖k‖ = 1: S_tᵀk = α(S_{t−1}ᵀk − S_{t−1}ᵀk (kᵀk)) + v_t (kᵀk) = v_t whatever
    the state and the decay, so a query equal to the key reads v_t back: the delta rule
    replaces what was stored under k. Every form, against no oracle but the algebra."""
    x = inputs(6, gated)
    x["beta"] = torch.ones_like(x["beta"])
    x["q"] = x["k"]
    args, kw = core_args(x)
    for o in (delta_reference(*args, **kw)[0], delta_chunked(*args, chunk=4, **kw)[0]):
        torch.testing.assert_close(o, x["v"], rtol=0, atol=1e-13)
    o_t, _ = delta_step(*(None if a is None else a[:, :, 0] for a in args), x["initial_state"])
    torch.testing.assert_close(o_t, x["v"][:, :, 0], rtol=0, atol=1e-13)


def test_a_zero_log_decay_is_deltanet() -> None:
    x = inputs(11, gated=False)
    args, kw = core_args(x)
    zero = torch.zeros_like(x["beta"])
    for core in (delta_reference, delta_chunked):
        o, s = core(*args, **kw)
        o_g, s_g = core(*args[:4], zero, **kw)
        torch.testing.assert_close(o_g, o, rtol=0, atol=1e-14)
        torch.testing.assert_close(s_g, s, rtol=0, atol=1e-14)


# --- exactness in float64 --------------------------------------------------------------------


@GATED
@pytest.mark.parametrize("chunk", [1, 8, 64])  # one position; 8 (n < 8, = 2·8, ragged); > n
@pytest.mark.parametrize("n", [1, 5, 16, 37])
def test_chunked_equals_the_reference_in_float64(n: int, chunk: int, gated: bool) -> None:
    """Measured at most 7.2e-15 (output) and 1.3e-15 (state)."""
    args, kw = core_args(inputs(n, gated))
    o, s = delta_reference(*args, **kw)
    o_c, s_c = delta_chunked(*args, chunk=chunk, **kw)
    assert o_c.shape == (B, H, n, DV) and s_c.shape == (B, H, DK, DV)
    assert max_diff(o_c, o) < 1e-13 and max_diff(s_c, s) < 1e-13
    o_0, o_0_ref = delta_chunked(*args, chunk=chunk)[0], delta_reference(*args)[0]  # S_0 = 0
    assert max_diff(o_0, o_0_ref) < 1e-13


@GATED
@pytest.mark.parametrize("prefill", [1, 16, 21])
def test_prefill_then_decode_equals_the_whole(prefill: int, gated: bool) -> None:
    """Chunked over the prompt (chunk 8), then delta_step token by token from its final state:
    the whole sequence's outputs and final state (measured at most 2.2e-15)."""
    n = 37
    x = inputs(n, gated)
    args, kw = core_args(x)
    o, s = delta_reference(*args, **kw)
    head = [None if t is None else t[:, :, :prefill] for t in args]
    o_head, state = delta_chunked(*head, chunk=8, **kw)
    outs = [o_head]
    for t in range(prefill, n):
        o_t, state = delta_step(*(None if a is None else a[:, :, t] for a in args), state)
        outs.append(o_t[:, :, None])
    assert max_diff(torch.cat(outs, dim=2), o) < 1e-13 and max_diff(state, s) < 1e-13


@GATED
def test_chunked_in_pieces_carries_the_state(gated: bool) -> None:
    args, kw = core_args(inputs(30, gated))
    o, s = delta_chunked(*args, chunk=8, **kw)
    first = [None if t is None else t[:, :, :13] for t in args]
    rest = [None if t is None else t[:, :, 13:] for t in args]
    o1, s1 = delta_chunked(*first, chunk=8, **kw)
    o2, s2 = delta_chunked(*rest, chunk=5, initial_state=s1)
    assert max_diff(torch.cat([o1, o2], dim=2), o) < 1e-13 and max_diff(s2, s) < 1e-13


def test_decode_step_leaves_its_state_untouched() -> None:
    x = inputs(1, gated=True)
    state = x["initial_state"].clone()
    delta_step(*(x[a][:, :, 0] for a in ("q", "k", "v", "beta", "g")), state)
    assert torch.equal(state, x["initial_state"])


# --- causality, gradients, fp32 --------------------------------------------------------------


@GATED
@pytest.mark.parametrize("t", [0, 6, 7, 12])  # first, inside a chunk, a chunk's last, later
def test_no_output_depends_on_a_later_position(t: int, gated: bool) -> None:
    """The gradient of o[:, :, :t+1] is exactly 0 at every later position of every input."""
    x = inputs(16, gated)
    leaves = {a: x[a].requires_grad_() for a in ("q", "k", "v", "beta", "g") if x[a] is not None}
    args, kw = core_args(x)
    o, _ = delta_chunked(*args, chunk=8, **kw)
    grads = torch.autograd.grad(o[:, :, : t + 1].sum(), list(leaves.values()))
    for name, grad in zip(leaves, grads, strict=True):
        assert torch.equal(grad[:, :, t + 1 :], torch.zeros_like(grad[:, :, t + 1 :])), name


@GATED
def test_gradients_of_the_chunked_form_equal_the_reference(gated: bool) -> None:
    """Every input's gradient (the initial state's too) of a weighted sum of the outputs and
    the final state, b = 1, h = 2, n = 11, dk = 3, chunk 4: measured at most 4.4e-15."""
    x = inputs(11, gated, b=1, h=2, dk=3)
    names = [a for a in x if x[a] is not None]
    gen = torch.Generator().manual_seed(1)
    w_o = torch.randn(1, 2, 11, DV, generator=gen, dtype=F64)
    w_s = torch.randn(1, 2, 3, DV, generator=gen, dtype=F64)
    grads = []
    for chunk in (None, 4):  # None: the reference
        leaves = {a: x[a].detach().clone().requires_grad_() for a in names}
        args, kw = core_args({**x, **leaves})
        run = (
            delta_reference(*args, **kw)
            if chunk is None
            else delta_chunked(*args, chunk=chunk, **kw)
        )
        loss = (run[0] * w_o).sum() + (run[1] * w_s).sum()
        grads.append(torch.autograd.grad(loss, list(leaves.values())))
    for name, ref, got in zip(names, *grads, strict=True):
        assert max_diff(got, ref) < 1e-13, name


@GATED
def test_the_chunked_form_passes_gradcheck(gated: bool) -> None:
    """Against finite differences, not the reference: b = h = 1, n = 5, dk = 3, chunk 2."""
    x = inputs(5, gated, b=1, h=1, dk=3, dv=2)
    names = [a for a in x if x[a] is not None]

    def chunked(*ts: Tensor) -> tuple[Tensor, Tensor]:
        given = dict(zip(names, ts, strict=True))
        args, kw = core_args({**x, **given})
        return delta_chunked(*args, chunk=2, **kw)

    leaves = tuple(x[a].detach().clone().requires_grad_() for a in names)
    assert torch.autograd.gradcheck(chunked, leaves)


@GATED
def test_fp32_is_within_1e_5_of_the_largest_output(gated: bool) -> None:
    """fp32 against the float64 reference at n = 256, chunk 64, dk = dv = 16: measured 4.3e-6
    (DeltaNet) and 2.3e-6 (gated) on outputs up to 18.2 and 12.7, 2.3e-7 and 1.8e-7 of them;
    the states 3.6e-7 and 5.3e-7 of their largest."""
    x = inputs(256, gated, b=2, h=2, dk=16, dv=16)
    args, kw = core_args(x)
    o, s = delta_reference(*args, **kw)
    args32 = [None if t is None else t.float() for t in args]
    o32, s32 = delta_chunked(*args32, chunk=64, initial_state=kw["initial_state"].float())
    assert o32.dtype == s32.dtype == torch.float32
    assert max_diff(o32.double(), o) < 1e-5 * o.abs().max().item()
    assert max_diff(s32.double(), s) < 1e-5 * s.abs().max().item()


def test_strong_decays_neither_overflow_nor_lose_the_reference() -> None:
    """g down to −1e4 (α underflows to 0 in any float): nothing overflows (ratios are formed as
    exp of non-positive differences), in fp32 and float64 both."""
    x = inputs(37, gated=True)
    x["g"] = -torch.rand_like(x["beta"]) * 1e4
    args, kw = core_args(x)
    o, s = delta_reference(*args, **kw)
    torch.testing.assert_close(delta_chunked(*args, chunk=8, **kw), (o, s), rtol=0, atol=1e-13)
    o32, s32 = delta_chunked(
        *(t.float() for t in args), chunk=8, initial_state=kw["initial_state"].float()
    )
    assert torch.isfinite(o32).all() and torch.isfinite(s32).all()
    torch.testing.assert_close(o32.double(), o, rtol=1e-5, atol=1e-5)


def test_half_inputs_accumulate_and_return_in_fp32() -> None:
    args, _ = core_args(inputs(9, gated=True))
    half = [t.to(torch.bfloat16) for t in args]
    for o, s in (delta_chunked(*half, chunk=4), delta_reference(*half)):
        assert o.dtype == s.dtype == torch.float32


# --- padding ---------------------------------------------------------------------------------


@GATED
@pytest.mark.parametrize("chunk", [4, 64])
def test_a_padded_token_changes_no_state_and_its_nan_reaches_nothing(
    chunk: int, gated: bool
) -> None:
    """Padding at the start, inside and at the end, NaN in every padded q, k, v, β and g: the
    output there is 0, each sequence's real outputs and final state are those of its real
    tokens alone, and the gradients are finite (0 at the padded positions)."""
    n = 13
    x = inputs(n, gated)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[0, :3], mask[0, 6:8], mask[1, 9:] = False, False, False
    pad = (~mask)[:, None, :].expand(B, H, n)
    for a in ("q", "k", "v", "beta", "g"):
        if x[a] is not None:
            x[a] = torch.where(pad if x[a].dim() == 3 else pad[..., None], torch.nan, x[a])
            x[a].requires_grad_()
    args, kw = core_args(x)
    o, s = delta_chunked(*args, chunk=chunk, mask=mask, **kw)
    o_ref, s_ref = delta_reference(*args, mask=mask, **kw)
    assert torch.equal(o[pad], torch.zeros_like(o[pad]))
    assert max_diff(o, o_ref) < 1e-13 and max_diff(s, s_ref) < 1e-13
    for i in range(B):
        real = [None if t is None else t[i : i + 1, :, mask[i]].detach() for t in args]
        alone, s_alone = delta_reference(*real, initial_state=kw["initial_state"][i : i + 1])
        assert max_diff(o[i : i + 1, :, mask[i]], alone) < 1e-13
        assert max_diff(s[i : i + 1], s_alone) < 1e-13
    leaves = [t for t in args if t is not None]
    for grad in torch.autograd.grad(o.sum() + s.sum(), leaves):
        assert torch.isfinite(grad).all()
        assert torch.equal(grad[pad], torch.zeros_like(grad[pad]))


def test_a_padded_decode_step_keeps_the_state_and_outputs_zero() -> None:
    x = inputs(1, gated=True)
    token = [x[a][:, :, 0].clone() for a in ("q", "k", "v", "beta", "g")]
    for t in token:
        t[1] = torch.nan
    mask = torch.tensor([True, False])
    o_t, state = delta_step(*token, x["initial_state"], mask=mask)
    assert torch.equal(o_t[1], torch.zeros_like(o_t[1]))
    assert torch.equal(state[1], x["initial_state"][1])
    o_0, s_0 = delta_step(*(t[:1] for t in token), x["initial_state"][:1])
    torch.testing.assert_close((o_t[:1], state[:1]), (o_0, s_0), rtol=0, atol=0)


# --- arguments and size ----------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [0, -8, 2.5, True, "8", None])
def test_a_bad_chunk_is_refused_naming_it(chunk: object) -> None:
    args, _ = core_args(inputs(4, gated=False))
    with pytest.raises(ValueError, match=r"^chunk: must be an integer >= 1, got "):
        delta_chunked(*args, chunk=chunk)  # type: ignore[arg-type]


def test_state_elements_is_the_state_of_one_head() -> None:
    args, kw = core_args(inputs(3, gated=True))
    _, s = delta_chunked(*args, chunk=2, **kw)
    assert state_elements(DK, DV) == DK * DV == s[0, 0].numel()


ROWS = ((3, 1, 9, 14, 10), (37,))  # starts inside chunks of 8, on one, a one-token document


@GATED
@pytest.mark.parametrize("chunk", [8, 12])
def test_a_reset_at_each_document_is_each_document_alone(gated: bool, chunk: int) -> None:
    """Packed documents (``starts``): the chunked form equals the reference's reset (the state
    zeroed), outputs and gradients, and each document equals the chunked form run on it alone
    from a zero state. DeltaNet too (no gate: a reset is its first decay). Measured: outputs
    and states at most 2.9e-15 from the reference, gradients 8.9e-15."""
    x = inputs(37, gated, b=2, seed=9)
    x["initial_state"] = None
    starts = torch.stack([torch.cat([torch.arange(n) == 0 for n in row]) for row in ROWS])
    names = [a for a in x if x[a] is not None]
    w = torch.randn(2, H, 37, DV, generator=torch.Generator().manual_seed(10), dtype=F64)
    runs = []
    for chunked in (False, True):
        leaves = {a: x[a].detach().clone().requires_grad_() for a in names}
        args, kw = core_args({**x, **leaves})
        fn = delta_chunked if chunked else delta_reference
        o, s = fn(*args, starts=starts, **kw, **({"chunk": chunk} if chunked else {}))
        runs.append((o, s, torch.autograd.grad((o * w).sum() + s.sum(), list(leaves.values()))))
    (o_ref, s_ref, g_ref), (o, s, g) = runs
    assert max_diff(o, o_ref) < 1e-12 and max_diff(s, s_ref) < 1e-12
    for name, got, want in zip(names, g, g_ref, strict=True):
        assert torch.isfinite(got).all() and max_diff(got, want) < 1e-11, name
    for row, lengths in enumerate(ROWS):
        start = 0
        for n in lengths:
            part = {a: None if t is None else t[row : row + 1, :, start : start + n]
                    for a, t in x.items() if a != "initial_state"}  # fmt: skip
            alone, last = delta_chunked(*core_args({**part, "initial_state": None})[0], chunk=chunk)
            assert max_diff(o[row : row + 1, :, start : start + n], alone) < 1e-12
            start += n
        assert max_diff(s[row : row + 1], last) < 1e-12
