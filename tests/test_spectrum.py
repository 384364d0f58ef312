"""The spectrum of P (Linformer's Figure 1): hand cases with known singular values, averaging
over heads and batch, padding, a random model's curves, refusals."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import attnbench
from attnbench.quality.spectrum import context_matrices, cumulative_spectrum, spectrum

N, D, H = 8, 16, 2  # head_dim 8 = N: head 1 can give every token its own direction


def hand_model() -> torch.nn.Module:
    """One layer whose Q = K projection is zero for head 0 (scores 0: uniform P, rank 1) and
    the identity for head 1 (so P there is whatever x's directions make it)."""
    model = attnbench.build_model("vanilla", layers=1, d_model=D, n_heads=H, d_ff=8, max_seq_len=N)
    attn = model.layers[0].attn
    w = torch.eye(D)
    w[: D // H] = 0  # head 0's rows
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj):
            proj.weight.copy_(w)
            proj.bias.zero_()
    return model


def one_hot(slots: list[int]) -> torch.Tensor:
    """(1, N, D): token i = 10·e_{8 + slots[i]}, i.e. direction slots[i] of head 1. Equal
    slots score 100/√8 ≈ 35 against each other, different ones 0: P is block uniform."""
    x = torch.zeros(1, N, D)
    for i, s in enumerate(slots):
        x[0, i, D // H + s] = 10.0
    return x


IDENTITY = one_hot(list(range(N)))  # P ≈ I: σ all 1, cumulative i/n
BLOCKS = one_hot([0] * 4 + [1] * 4)  # two uniform 4 × 4 blocks: σ = 1, 1, 0…: 0.5, 1, 1…


def test_hand_cases_have_their_known_spectra() -> None:
    model = hand_model()
    linear = torch.arange(1, N + 1, dtype=torch.float64) / N
    block = torch.tensor([0.5] + [1.0] * (N - 1), dtype=torch.float64)
    for x, head1 in ((IDENTITY, linear), (BLOCKS, block)):
        p = context_matrices(model.layers[0].attn, x)
        assert p.shape == (1, H, N, N) and p.dtype == torch.float64
        curves = cumulative_spectrum(p)[0]  # (h, n)
        assert torch.allclose(curves[0], torch.ones(N, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(curves[1], head1, atol=1e-12)


def test_spectrum_averages_heads_then_batch() -> None:
    model = hand_model()
    x = torch.cat([IDENTITY, BLOCKS])  # batch of two
    out = spectrum(model, x, index=2)
    assert out["n"] == N and out["index"] == 2
    i = torch.arange(1, N + 1, dtype=torch.float64) / N
    block = torch.tensor([0.5] + [1.0] * (N - 1), dtype=torch.float64)
    # per layer: mean over batch and heads of (head 0: all ones; head 1: i/n or the blocks)
    want = ((1 + i) / 2 + (1 + block) / 2) / 2
    assert len(out["cumulative"]) == 1 and len(out["cumulative"][0]) == N
    assert out["cumulative"][0] == pytest.approx(want.tolist(), abs=1e-12)
    # per (layer, head), at the 2nd singular value, mean over the batch: head 1 (2/8 + 1)/2
    assert out["at_index"] == [pytest.approx([1.0, (2 / N + 1.0) / 2], abs=1e-12)]


def test_context_matrices_are_softmax_by_hand() -> None:
    layer = attnbench.create("vanilla", d_model=D, n_heads=H, max_seq_len=N)
    x = torch.randn(2, N, D)
    with torch.no_grad():
        q = (x.double() @ layer.q_proj.weight.double().T + layer.q_proj.bias.double()).view(
            2, N, H, D // H
        )
        k = (x.double() @ layer.k_proj.weight.double().T + layer.k_proj.bias.double()).view(
            2, N, H, D // H
        )
    want = torch.softmax(torch.einsum("bihc,bjhc->bhij", q, k) / math.sqrt(D // H), -1)
    assert torch.allclose(context_matrices(layer, x), want, atol=1e-14)
    causal = attnbench.create("vanilla", d_model=D, n_heads=H, max_seq_len=N, causal=True)
    assert torch.all(context_matrices(causal, x).triu(1) == 0)


def test_padding_zeroes_padded_rows_and_columns() -> None:
    model = hand_model()
    mask = torch.zeros(1, N, dtype=torch.bool)
    mask[0, 5:] = True
    p = context_matrices(model.layers[0].attn, IDENTITY, mask)
    assert torch.all(p[..., 5:, :] == 0) and torch.all(p[..., :, 5:] == 0)
    assert torch.allclose(p[0, 0, :5, :5], torch.full((5, 5), 0.2, dtype=torch.float64))
    out = spectrum(model, IDENTITY, mask, index=N)
    # head 0: uniform over 5 keys, rank 1; head 1: identity on 5 tokens, cumulative i/5
    head1 = torch.tensor([min(i / 5, 1.0) for i in range(1, N + 1)], dtype=torch.float64)
    assert out["cumulative"][0] == pytest.approx(((1 + head1) / 2).tolist(), abs=1e-12)


def test_random_model_gives_valid_cumulative_curves() -> None:
    n = 32
    model = attnbench.build_model("vanilla", layers=3, d_model=D, n_heads=H, d_ff=16, max_seq_len=n)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, 20:] = True
    out = spectrum(model, torch.randn(2, n, D), mask, index=8)
    assert len(out["cumulative"]) == 3 and [len(c) for c in out["cumulative"]] == [n] * 3
    assert [len(row) for row in out["at_index"]] == [H] * 3
    for layer, curve in enumerate(out["cumulative"]):
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(curve))
        assert curve[-1] == pytest.approx(1.0, abs=1e-12)
        assert 0 < curve[0] < 1
        assert curve[7] == pytest.approx(sum(out["at_index"][layer]) / H, abs=1e-12)


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


def test_refusals() -> None:
    performer = attnbench.build_model(
        "performer", layers=1, d_model=D, n_heads=H, d_ff=8, max_seq_len=N
    )
    with pytest.raises(ValueError) as e:
        spectrum(performer, torch.randn(1, N, D), index=4)
    assert one_line(e).startswith("layer: must be a vanilla or sdpa layer")
    with pytest.raises(ValueError) as e:
        spectrum(hand_model(), IDENTITY, index=N + 1)
    assert one_line(e).startswith(f"index: must be an integer in [1, {N}]")
    with pytest.raises(ValueError, match=r"^model: must be an attnbench Encoder"):
        spectrum(torch.nn.Linear(D, D), IDENTITY, index=4)
    all_padding = torch.zeros(2, N, dtype=torch.bool)
    all_padding[1] = True
    with pytest.raises(ValueError, match=r"^key_padding_mask: a sequence is all padding"):
        spectrum(hand_model(), torch.cat([IDENTITY, IDENTITY]), all_padding, index=4)
    with pytest.raises(ValueError, match=r"^x: must be"):
        context_matrices(hand_model().layers[0].attn, torch.randn(1, N, D + 1))
