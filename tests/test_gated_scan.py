"""The gated linear recurrence's cores (attention/gated_scan.py), for its three decay shapes:
per key dimension (GLA), per head and position (Mamba-2), fixed per head (RetNet).

The chunked form against the token-by-token reference in float64, for n of one position, fewer
than a chunk, a multiple of it and none; prefill then decode against the whole forward; no
future leak; gradients against the reference's; fp32 against float64; strong decays; padding.
Tiny tensors: the whole file runs in seconds on a loaded CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from attnbench.attention.gated_scan import (
    gated_chunked,
    gated_reference,
    gated_step,
    state_elements,
)

B, H, DK, DV = 2, 2, 4, 3  # dk ≠ dv, as Mamba-2's state size and head size differ
DECAYS = ("per_dim", "per_head", "fixed")
NS = (1, 5, 16, 37)  # one position, fewer than a chunk of 8, a multiple of it, none
F64 = torch.float64


def decay(kind: str, n: int, gen: torch.Generator, dtype: torch.dtype = F64) -> Tensor:
    """g ≤ 0 in the shape each mixer gives: GLA's (b, h, n, dk), Mamba-2's Δ·A (b, h, n, 1),
    RetNet's log γ_h (1, h, 1, 1) with γ_h = 1 − 2^(−5−h) as in its paper."""
    if kind == "per_dim":
        return -torch.rand(B, H, n, DK, generator=gen, dtype=dtype)
    if kind == "per_head":
        return -torch.rand(B, H, n, 1, generator=gen, dtype=dtype)
    return torch.log1p(-(2.0 ** (-5.0 - torch.arange(H, dtype=dtype)))).view(1, H, 1, 1)


def inputs(kind: str, n: int, seed: int = 0, dtype: torch.dtype = F64) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, n, DK, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, n, DV, generator=gen, dtype=dtype)
    s0 = torch.randn(B, H, DK, DV, generator=gen, dtype=dtype)
    return {"q": q, "k": k, "v": v, "g": decay(kind, n, gen, dtype), "initial_state": s0}


def err(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("kind", DECAYS)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("chunk", [8, 12, 64])  # 12: per-dim sub-blocks of 8 padded; 64 > n
def test_chunked_equals_the_reference_in_float64(kind: str, n: int, chunk: int) -> None:
    x = inputs(kind, n)
    o_ref, s_ref = gated_reference(**x, scale=0.5)
    o, s = gated_chunked(**x, chunk=chunk, scale=0.5)
    assert o.dtype == s.dtype == F64 and o.shape == (B, H, n, DV) and s.shape == (B, H, DK, DV)
    assert err(o, o_ref) < 1e-13  # measured at most 5.3e-15 (RetNet, n = 37), |o| up to 10
    assert err(s, s_ref) < 1e-13  # measured at most 7.1e-15 (the same)


@pytest.mark.parametrize("kind", DECAYS)
@pytest.mark.parametrize("prefill", [0, 1, 16, 29])
def test_prefill_then_decode_equals_the_whole_forward(kind: str, prefill: int) -> None:
    n = 37
    x = inputs(kind, n, seed=1)
    o_all, s_all = gated_chunked(**x, chunk=8)
    g = x["g"].expand(B, H, n, x["g"].shape[-1])
    part = {key: t[..., :prefill, :] for key, t in x.items() if key != "initial_state"}
    o_pre, state = gated_chunked(**part, chunk=8, initial_state=x["initial_state"])
    outs = [o_pre]
    for t in range(prefill, n):
        before = state.clone()
        o_t, state_next = gated_step(
            x["q"][..., t, :], x["k"][..., t, :], x["v"][..., t, :], g[..., t, :], state
        )
        assert torch.equal(state, before)  # the step returns a new state, the old one kept
        outs.append(o_t.unsqueeze(-2))
        state = state_next
    assert err(torch.cat(outs, dim=-2), o_all) < 1e-13  # measured at most 1.4e-14 (RetNet)
    assert err(state, s_all) < 1e-13  # measured at most 3.6e-15 (RetNet)


@pytest.mark.parametrize("kind", DECAYS)
def test_no_output_sees_a_later_token(kind: str) -> None:
    n, t = 37, 13  # position 13: inside the second chunk of 8
    x = inputs(kind, n, seed=2)
    later = inputs(kind, n, seed=3)
    changed = dict(x)
    for key in ("q", "k", "v", "g"):
        if x[key].shape[-2] == n:  # RetNet's fixed g has no positions
            changed[key] = torch.cat(
                [x[key][..., : t + 1, :], 100 * later[key][..., t + 1 :, :]], -2
            )
    for chunk in (8, 64):
        o, _ = gated_chunked(**x, chunk=chunk)
        o_changed, _ = gated_chunked(**changed, chunk=chunk)
        assert torch.equal(o[..., : t + 1, :], o_changed[..., : t + 1, :])
        leaves = {key: x[key].clone().requires_grad_() for key in ("q", "k", "v", "g")}
        o, _ = gated_chunked(**leaves, chunk=chunk, initial_state=x["initial_state"])
        grads = torch.autograd.grad(o[..., : t + 1, :].sum(), list(leaves.values()))
        for key, grad in zip(leaves, grads, strict=True):
            if grad.shape[-2] == n:
                assert not grad[..., t + 1 :, :].any(), key  # exactly 0, not merely small


@pytest.mark.parametrize("kind", DECAYS)
@pytest.mark.parametrize("chunk", [4, 12])  # 12 > n: one chunk, padded to sub-blocks of 8
def test_gradients_of_the_chunked_form_are_the_references(kind: str, chunk: int) -> None:
    x = {key: t.requires_grad_() for key, t in inputs(kind, 11, seed=4).items()}
    weights = torch.randn(B, H, 11, DV, generator=torch.Generator().manual_seed(5), dtype=F64)
    w_state = torch.randn(B, H, DK, DV, generator=torch.Generator().manual_seed(6), dtype=F64)

    def grads(fn: Callable[..., tuple[Tensor, Tensor]], **kw: int) -> tuple[Tensor, ...]:
        o, s = fn(**x, scale=0.7, **kw)
        return torch.autograd.grad((o * weights).sum() + (s * w_state).sum(), list(x.values()))

    for got, want in zip(grads(gated_chunked, chunk=chunk), grads(gated_reference), strict=True):
        assert err(got, want) < 1e-12  # measured at most 5.7e-14 (RetNet's shared g, |dg| 260)


@pytest.mark.parametrize("kind", DECAYS)
def test_fp32_is_float64_within_a_stated_tolerance(kind: str) -> None:
    x64 = inputs(kind, 37, seed=7)
    o_ref, s_ref = gated_reference(**x64)
    x32 = {key: t.float() for key, t in x64.items()}
    for chunk in (8, 64):
        o, s = gated_chunked(**x32, chunk=chunk)
        assert o.dtype == s.dtype == torch.float32
        assert err(o.double(), o_ref) < 2e-5  # measured at most 4.5e-6 (RetNet), |o| up to 24
        assert err(s.double(), s_ref) < 2e-5  # measured at most 1.7e-6 (RetNet)
    half = {key: t.bfloat16() for key, t in x32.items()}
    assert gated_chunked(**half)[0].dtype == torch.float32  # accumulated in fp32, returned so


@pytest.mark.parametrize("kind", ["per_dim", "per_head"])
def test_strong_decays_overflow_nothing(kind: str) -> None:
    """g down to −60 per token: a chunk of 37 sums to about −1100, e^{1100} overflows even
    float64 had the chunked form factorised (q e^{G})(k e^{−G})ᵀ."""
    x = inputs(kind, 37, seed=8)
    x["g"] = 60 * x["g"]
    o_ref, s_ref = gated_reference(**x)
    o, s = gated_chunked(**x, chunk=64)
    assert err(o, o_ref) < 1e-13 and err(s, s_ref) < 1e-13  # measured at most 1.8e-15, 2.2e-16
    o32, s32 = gated_chunked(**{key: t.float() for key, t in x.items()}, chunk=64)
    assert o32.isfinite().all() and err(o32.double(), o_ref) < 5e-6  # measured at most 8.3e-7
    assert err(s32.double(), s_ref) < 5e-6  # measured at most 1.6e-7; the fp32 recurrence 1.3e-6


def holes(n: int) -> Tensor:
    """(B, n) True = real: row 0 right-padded, row 1 left-padded with holes inside its chunks."""
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[0, n - 9 :] = False
    mask[1, :3] = False
    mask[1, 10:13] = False
    mask[1, 20] = False
    return mask


@pytest.mark.parametrize("kind", DECAYS)
def test_a_padded_token_changes_no_state_and_its_nan_reaches_no_real_output(kind: str) -> None:
    n = 37
    mask = holes(n)
    x = inputs(kind, n, seed=9)
    dirty = {key: t.clone() for key, t in x.items()}
    for key in ("q", "k", "v", "g"):
        if dirty[key].shape[-2] == n:
            dirty[key].masked_fill_(~mask[:, None, :, None], math.nan)
    leaves = {key: t.requires_grad_() for key, t in dirty.items()}
    for fn, kw in ((gated_chunked, {"chunk": 8}), (gated_reference, {})):
        o, s = fn(**leaves, mask=mask, **kw)
        assert not o.masked_select(~mask[:, None, :, None]).any()  # 0 at every padded position
        for i in range(B):  # the real tokens alone, compacted: the same outputs and state
            real = {key: t[i : i + 1] if t.shape[0] == B else t for key, t in x.items()}
            real.update(
                {
                    key: real[key][..., mask[i], :]
                    for key in ("q", "k", "v", "g")
                    if real[key].shape[-2] == n
                }
            )
            o_i, s_i = gated_reference(**real)
            assert err(o[i : i + 1][..., mask[i], :], o_i) < 1e-13  # measured at most 7.1e-15
            assert err(s[i : i + 1], s_i) < 1e-13  # measured at most 5.3e-15
        grads = torch.autograd.grad(o.sum() + s.sum(), list(leaves.values()))
        assert all(grad.isfinite().all() for grad in grads)
    o_t, s_t = gated_step(
        *(t[:, :, 0] for t in (dirty["q"], dirty["k"], dirty["v"])),
        dirty["g"][:, :, 0],
        x["initial_state"],
        mask=mask[:, 0],
    )
    assert torch.equal(s_t[1], x["initial_state"][1]) and not o_t[1].any()  # row 1 padded at 0


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8", None])
def test_chunk_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^chunk: must be an integer >= 1"):
        gated_chunked(**inputs("per_head", 5), chunk=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"g": torch.zeros(B, H, 5, 3)}, "g"),
        ({"g": torch.zeros(B, H, 5)}, "g"),
        ({"k": torch.zeros(B, H, 5, DK + 1)}, "k, v"),
        ({"mask": torch.ones(B, 4, dtype=torch.bool)}, "mask"),
        ({"mask": torch.ones(B, 5)}, "mask"),
        ({"initial_state": torch.zeros(B, H, DV, DK)}, "initial_state"),
    ],
)
def test_a_misshapen_argument_is_named(change: dict[str, Tensor], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: must (be|broadcast to)"):
        gated_chunked(**{**inputs("per_dim", 5), **change})


def test_the_state_is_dk_by_dv_per_head_whatever_n() -> None:
    for n in (1, 37):
        _, s = gated_chunked(**inputs("per_dim", n))
        assert s[0, 0].numel() == state_elements(DK, DV) == DK * DV


def starts_of(rows: tuple[tuple[int, ...], ...]) -> Tensor:
    """(b, n) True at each document's first position, from each row's document lengths."""
    return torch.stack([torch.cat([torch.arange(n) == 0 for n in row]) for row in rows])


ROWS = ((3, 1, 9, 14, 10), (37,))  # starts inside chunks of 8, on one, a one-token document


@pytest.mark.parametrize("kind", DECAYS)
@pytest.mark.parametrize("chunk", [8, 12])
def test_a_reset_at_each_document_is_each_document_alone(kind: str, chunk: int) -> None:
    """Packed documents (``starts``): the chunked form equals the reference's reset (the state
    zeroed), outputs and gradients, and each document equals the chunked form run on it
    alone from a zero state; the final state is the last document's. Strong decays (g down
    to −30) too: −∞ at a start must meet no other −∞. Measured: outputs and states at most
    1.8e-15 from the reference, gradients 3.6e-15."""
    x = inputs(kind, 37, seed=7)
    x["g"] = x["g"] * 30
    del x["initial_state"]
    starts = starts_of(ROWS)
    leaves = {key: t.clone().requires_grad_() for key, t in x.items()}
    w = torch.randn(B, H, 37, DV, generator=torch.Generator().manual_seed(8), dtype=F64)
    runs = []
    for fn, kw in ((gated_reference, {}), (gated_chunked, {"chunk": chunk})):
        o, s = fn(**leaves, scale=0.5, starts=starts, **kw)
        runs.append((o, s, torch.autograd.grad((o * w).sum() + s.sum(), list(leaves.values()))))
    (o_ref, s_ref, g_ref), (o, s, g) = runs
    assert err(o, o_ref) < 1e-12 and err(s, s_ref) < 1e-12
    for got, want in zip(g, g_ref, strict=True):
        assert torch.isfinite(got).all() and err(got, want) < 1e-11
    for row, lengths in enumerate(ROWS):
        start = 0
        for n in lengths:
            part = {  # RetNet's fixed g (1, h, 1, 1) serves every row and position
                key: t[row : row + 1, :, start : start + n] if t.shape[2] > 1 else t
                for key, t in x.items()
            }
            alone, last = gated_chunked(**part, scale=0.5, chunk=chunk)
            assert err(o[row : row + 1, :, start : start + n], alone) < 1e-12
            start += n
        assert err(s[row : row + 1], last) < 1e-12


def test_starts_of_the_wrong_shape_are_refused() -> None:
    with pytest.raises(ValueError, match=r"starts: must be bool \(b, n\) = \(2, 5\)"):
        gated_chunked(**inputs("per_head", 5), starts=torch.ones(2, 4, dtype=torch.bool))
