"""Nyströmformer against references it does not share code with.

* ``nystrom-attention`` (the public package) with our weights copied in, where the two
  parameterisations agree, and where they do not, a test that says why;
* a float64 reference written here from the paper's equations, one sequence at a time, with
  the padding cut out by boolean indexing (what the layer itself may not do) and the empty
  landmarks dropped rather than masked;
* plain float64 softmax attention: with a landmark per token Nyströmformer is exact given
  enough ``pinv_iterations`` (40 in the test), and on
  smooth inputs its error falls as the landmarks grow;
* ``torch.linalg.pinv`` for the iterative pseudo-inverse, and FlopCounterMode for the FLOPs.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attnbench
from attnbench.attention.nystromformer import iterative_pinv
from attnbench.measure.flops import count_flops

D, H = 32, 4


def _layer(n: int = 64, **params: object) -> torch.nn.Module:
    return attnbench.create("nystromformer", d_model=D, n_heads=H, max_seq_len=n, **params).eval()


# ----------------------------------------------------------------------------- the reference


def _softmax_rows(scores: torch.Tensor) -> torch.Tensor:
    e = (scores - scores.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def _pinv_eq16(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """The paper's iteration for one matrix, with ‖A‖₁ and ‖A‖∞ from torch.linalg.matrix_norm."""
    norm = torch.linalg.matrix_norm(a, ord=1) * torch.linalg.matrix_norm(a, ord=math.inf)
    z = a.T / norm
    eye = torch.eye(a.shape[0], dtype=a.dtype)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def _reference(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The layer's output in float64, from the paper's equations, one sequence and head at a
    time: segments over the real tokens (token r of L goes to segment ⌊r·m/L⌋), empty
    segments dropped, F·A⁺·(B·V) multiplied left to right, and the convolution as a loop over
    its taps on V with zeros at padded positions and beyond the ends."""
    cfg = layer.cfg
    p = {k: t.detach().double() for k, t in layer.state_dict().items()}
    x = x.double()
    b, n, d = x.shape
    dh = d // H
    out = torch.zeros(b, n, d, dtype=torch.float64)
    for s in range(b):
        real = torch.ones(n, dtype=torch.bool) if mask is None else ~mask[s]
        q = x[s] @ p["q_proj.weight"].T + p["q_proj.bias"]
        k = x[s] @ p["k_proj.weight"].T + p["k_proj.bias"]
        v = x[s] @ p["v_proj.weight"].T + p["v_proj.bias"]
        v = torch.where(real[:, None], v, 0.0)  # the convolution sees padding as zeros
        length = int(real.sum())
        m = cfg.num_landmarks if mask is not None else min(cfg.num_landmarks, n)
        bounds = [-(-j * length // m) for j in range(m + 1)]  # ⌈j·L/m⌉
        segments = [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]
        for head in range(H):
            cols = slice(head * dh, (head + 1) * dh)
            qh, kh, vh = q[:, cols], k[:, cols], v[:, cols]
            qr, kr, vr = qh[real], kh[real], vh[real]  # the sequence cut short
            q_l = torch.stack([qr[lo:hi].mean(0) for lo, hi in segments])
            k_l = torch.stack([kr[lo:hi].mean(0) for lo, hi in segments])
            f = _softmax_rows(qh @ k_l.T / math.sqrt(dh))  # (n, m')
            a = _softmax_rows(q_l @ k_l.T / math.sqrt(dh))  # (m', m')
            bk = _softmax_rows(q_l @ kr.T / math.sqrt(dh))  # (m', L)
            y = f @ _pinv_eq16(a, cfg.pinv_iterations) @ bk @ vr
            if cfg.conv_kernel:
                w = p["conv.weight"][head, 0, :, 0]  # (kernel,)
                half = cfg.conv_kernel // 2
                padded = torch.cat([torch.zeros(half, dh), vh, torch.zeros(half, dh)]).double()
                y = y + sum(w[t] * padded[t : t + n] for t in range(cfg.conv_kernel))
            out[s, :, cols] = y
    return out @ p["out_proj.weight"].T + p["out_proj.bias"]


def _check_against_reference(layer, x, mask, atol=1e-5, rtol=1e-4) -> None:
    with torch.inference_mode():
        got = layer(x, mask)
    want = _reference(layer, x, mask).to(got.dtype)
    keep = slice(None) if mask is None else ~mask
    torch.testing.assert_close(got[keep], want[keep], atol=atol, rtol=rtol)


@pytest.mark.parametrize(
    ("n", "m"),
    [(64, 16), (60, 16), (50, 7), (12, 16)],
    ids=["m_divides_n", "n_not_a_multiple", "uneven_segments", "fewer_tokens_than_m"],
)
def test_equals_the_float64_reference(n: int, m: int) -> None:
    layer = _layer(n, num_landmarks=m)
    _check_against_reference(layer, torch.randn(2, n, D), None)


def test_padded_sequences_equal_the_float64_reference() -> None:
    """Right padding, scattered padding, fewer real tokens than landmarks, and a sequence of
    padding only (whose outputs are not compared) in one batch."""
    n, m = 40, 8
    layer = _layer(n, num_landmarks=m)
    mask = torch.zeros(4, n, dtype=torch.bool)
    mask[0, 29:] = True  # 29 real tokens: segments of 3 and 4
    mask[1, 1::3] = True  # scattered
    mask[2, 5:] = True  # 5 real tokens < 8 landmarks: 3 empty segments
    mask[3] = True
    x = torch.randn(4, n, D)
    _check_against_reference(layer, x[:3], mask[:3])
    with torch.inference_mode():
        alone = layer(x[:3], mask[:3])
        together = layer(x, mask)
    assert torch.isfinite(together).all()
    torch.testing.assert_close(together[:3], alone)  # sequences are independent


@pytest.mark.parametrize(("n", "real"), [(50, 37), (50, 10), (64, 48)])
def test_padding_is_the_sequence_cut_short(n: int, real: int) -> None:
    """Beyond the contract test's case: n not a multiple of m, and fewer real tokens than m."""
    layer = _layer(n, num_landmarks=16)
    x = torch.randn(1, n, D)
    mask = torch.zeros(1, n, dtype=torch.bool)
    mask[0, real:] = True
    with torch.inference_mode():
        torch.testing.assert_close(
            layer(x, mask)[0, :real], layer(x[:, :real])[0], atol=1e-5, rtol=1e-4
        )


def test_non_finite_padding_does_not_leak() -> None:
    layer = _layer(40, num_landmarks=8)
    x = torch.randn(2, 40, D)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[0, 30:], mask[1, ::4] = True, True
    bad = x.clone()
    bad[0, 30:], bad[1, ::4] = float("inf"), float("nan")
    with torch.inference_mode():
        torch.testing.assert_close(layer(bad, mask)[~mask], layer(x, mask)[~mask])


# ------------------------------------------------------------------ exact softmax attention


def _softmax_attention(layer: torch.nn.Module, x: torch.Tensor, mask=None) -> torch.Tensor:
    """Plain float64 multi-head softmax attention with the layer's own projections."""
    q, k, v = layer.qkv_heads(x)
    scores = q @ k.mT / math.sqrt(layer.head_dim)
    if mask is not None:
        scores = scores.masked_fill(mask[:, None, None, :], -math.inf)
    return layer.out_proj(layer.merge_heads(scores.softmax(-1) @ v))


def test_a_landmark_per_token_is_exact_softmax_attention() -> None:
    """m = n: each segment is one token, so Q̃ = Q, K̃ = K and F A⁺ B = S S⁺ S = S."""
    n = 32
    layer = _layer(n, num_landmarks=n, pinv_iterations=40, conv_kernel=0).double()
    x = torch.randn(2, n, D, dtype=torch.float64)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, 20:] = True  # 20 real tokens: 12 landmarks empty, the rest one token each
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _softmax_attention(layer, x), atol=1e-9, rtol=1e-9)
        got, want = layer(x, mask), _softmax_attention(layer, x, mask)
    torch.testing.assert_close(got[~mask], want[~mask], atol=1e-9, rtol=1e-9)


def test_error_against_softmax_attention_falls_as_landmarks_grow() -> None:
    """On an input that varies smoothly along the sequence, segment means summarise their
    segments well, and more landmarks approximate softmax attention better: each doubling
    of m must at least halve the relative error (measured: by 3× to 10×)."""
    n = 128
    g = torch.Generator().manual_seed(0)
    t = torch.linspace(0, 1, n, dtype=torch.float64)[:, None]
    freq = 4 * torch.randn(D, generator=g, dtype=torch.float64)
    phase = 6.28 * torch.rand(D, generator=g, dtype=torch.float64)
    x = (3 * torch.sin(t * freq + phase))[None]  # (1, n, D), attention far from uniform
    errors = []
    for m in (4, 8, 16, 32, 64):
        torch.manual_seed(1)  # the same projections for every m
        layer = _layer(n, num_landmarks=m, pinv_iterations=30, conv_kernel=0).double()
        with torch.no_grad():
            want = _softmax_attention(layer, x)
            errors.append(float((layer(x) - want).norm() / want.norm()))
    assert all(b < 0.5 * a for a, b in itertools.pairwise(errors)), errors
    assert errors[-1] < 1e-4, errors


def test_iterative_pinv_converges_to_the_moore_penrose_inverse() -> None:
    a = torch.randn(3, 2, 16, 16, dtype=torch.float64).softmax(-1)  # like A: row-stochastic
    torch.testing.assert_close(iterative_pinv(a, 40), torch.linalg.pinv(a), atol=1e-8, rtol=1e-8)
    # and each step gets closer
    errors = [float((iterative_pinv(a, i) - torch.linalg.pinv(a)).norm()) for i in (1, 2, 3)]
    assert errors[0] > errors[1] > errors[2]


# ------------------------------------------------------------------ nystrom-attention (peer)


def _peer_and_ours(n: int, heads: int, m: int, iterations: int):
    """nystrom-attention's layer and ours with the same weights: its fused to_qkv split into
    our three projections (with zero bias: it has none), its to_out and its res_conv."""
    from nystrom_attention import NystromAttention

    peer = NystromAttention(
        dim=D, dim_head=D // heads, heads=heads, num_landmarks=m,
        pinv_iterations=iterations, residual_conv_kernel=33,
    ).eval()  # fmt: skip
    ours = attnbench.create(
        "nystromformer", d_model=D, n_heads=heads, max_seq_len=n, num_landmarks=m,
        pinv_iterations=iterations, conv_kernel=33,
    ).eval()  # fmt: skip
    with torch.no_grad():
        for proj, w in zip(
            (ours.q_proj, ours.k_proj, ours.v_proj), peer.to_qkv.weight.chunk(3), strict=True
        ):
            proj.weight.copy_(w)
            proj.bias.zero_()
        ours.out_proj.load_state_dict(peer.to_out[0].state_dict())
        ours.conv.weight.copy_(peer.res_conv.weight)
    return peer, ours


def _pinv_per_matrix(x: torch.Tensor, iters: int = 6) -> torch.Tensor:
    """nystrom-attention's ``moore_penrose_iter_pinv`` with one change: Z₀'s max row and
    column sums are taken per matrix (as the paper writes Z₀), not over the whole batch and
    every head."""
    abs_x = torch.abs(x)
    z = x.mT / (abs_x.sum(-1).amax(-1) * abs_x.sum(-2).amax(-1))[..., None, None]
    eye = torch.eye(x.shape[-1])[None]
    for _ in range(iters):
        xz = x @ z
        z = 0.25 * z @ (13 * eye - (xz @ (15 * eye - (xz @ (7 * eye - xz)))))
    return z


def test_equals_the_peer_for_one_sequence_and_one_head() -> None:
    """m divides n, no mask, zero QKV biases: the parameterisations agree. With batch 1 and
    one head, its Z₀ (max over the whole batch and every head) is ours (per matrix)."""
    peer, ours = _peer_and_ours(n=64, heads=1, m=16, iterations=6)
    x = torch.randn(1, 64, D)
    with torch.inference_mode():
        torch.testing.assert_close(ours(x), peer(x), atol=1e-5, rtol=1e-4)


def test_equals_the_peer_when_its_pinv_starts_per_matrix(monkeypatch) -> None:
    """With several sequences and heads the peer scales Z₀ by the largest column and row sums
    over all of them, so after 6 steps its A⁺ (and output) differs from ours, and a sequence's
    output depends on the rest of its batch. Patched to start per matrix, it equals ours."""
    import nystrom_attention.nystrom_attention as peer_module

    peer, ours = _peer_and_ours(n=64, heads=H, m=16, iterations=6)
    x = torch.randn(3, 64, D)
    with torch.inference_mode():
        want = ours(x)
        assert not torch.allclose(peer(x), want, atol=1e-4, rtol=1e-3)  # the known difference
        monkeypatch.setattr(peer_module, "moore_penrose_iter_pinv", _pinv_per_matrix)
        torch.testing.assert_close(peer(x), want, atol=1e-5, rtol=1e-4)


def test_the_peer_differs_where_m_does_not_divide_n(monkeypatch) -> None:
    """At n = 60, m = 16 the peer pads 4 zero tokens at the front and cuts 64 positions into
    16 segments of 4: its first landmark is the mean of the 4 zeros (Q̃ = K̃ = 0 there), and
    the zeros are keys (with zero values) in softmax(Q̃Kᵀ). Ours cuts the 60 real tokens into
    segments of 3 and 4 (checked against the float64 reference above). Different landmarks,
    different outputs, even with the peer's pinv started per matrix."""
    import nystrom_attention.nystrom_attention as peer_module

    monkeypatch.setattr(peer_module, "moore_penrose_iter_pinv", _pinv_per_matrix)
    peer, ours = _peer_and_ours(n=60, heads=H, m=16, iterations=6)
    x = torch.randn(1, 60, D)
    with torch.inference_mode():
        assert not torch.allclose(peer(x), ours(x), atol=1e-3, rtol=1e-2)


# ------------------------------------------------------------------------------------ FLOPs


def _conv_backward_flop_with_groups(
    grad_out_shape, x_shape, w_shape, *args, out_shape=None, **kwargs
) -> int:
    """Each gradient of a convolution (input, weight) costs what its forward does:
    2 · batch · output positions · every weight (out channels × in channels per group × taps).

    FlopCounterMode's own formula counts the weight gradient as a dense convolution over
    every (input, output) channel pair, ignoring groups: for our depthwise convolution
    (groups = d channels) d times the 2·b·n·d·kernel it does. Its input gradient is right."""
    output_mask = args[7]
    forward = 2 * grad_out_shape[0] * math.prod(grad_out_shape[2:]) * math.prod(w_shape)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


def _count_backward(model: torch.nn.Module, x: torch.Tensor) -> int:
    loss = model(x).pow(2).mean()
    mapping = {torch.ops.aten.convolution_backward: _conv_backward_flop_with_groups}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        loss.backward()
    return counter.get_total_flops()


CASES = [
    (64, {}),  # m = 64 = n: one token per segment
    (64, {"num_landmarks": 16}),
    (60, {"num_landmarks": 16}),  # segment weights by a matmul
    (12, {"num_landmarks": 16}),  # n < m: m = n
    (64, {"num_landmarks": 8, "conv_kernel": 0, "pinv_iterations": 2}),
]


@pytest.mark.parametrize(("n", "params"), CASES, ids=lambda v: str(v))
def test_forward_flops_equal_the_counter(n: int, params: dict) -> None:
    model = attnbench.build_model(
        "nystromformer", layers=2, d_model=64, n_heads=4, d_ff=128, max_seq_len=64, **params
    )
    assert count_flops(model, torch.randn(2, n, 64)) == model.flops(2, n)


@pytest.mark.parametrize(("n", "params"), CASES, ids=lambda v: str(v))
def test_backward_flops_equal_the_counter(n: int, params: dict) -> None:
    model = attnbench.build_model(
        "nystromformer", layers=2, d_model=64, n_heads=4, d_ff=128, max_seq_len=64, **params
    ).train()
    x = torch.randn(2, n, 64, requires_grad=True)
    assert _count_backward(model, x) == model.flops_backward(2, n)
    if not params.get("conv_kernel", 33):  # no convolution: the stock counter agrees too
        loss = model(x).pow(2).mean()
        assert count_flops(loss.backward) == model.flops_backward(2, n)


def test_the_corrected_counter_on_one_depthwise_convolution() -> None:
    """The backward test's correction, on a depthwise convolution alone: each gradient counts
    2·b·n·c·kernel. (The stock counter gives c× that for the weight gradient; checked only as
    'at least', so a fixed torch or attnbench.measure.flops does not break this test.)"""
    b, c, n, kernel = 2, 8, 32, 5
    x = torch.randn(b, c, 1, n, requires_grad=True)
    w = torch.randn(c, 1, 1, kernel, requires_grad=True)
    true = 2 * b * n * c * kernel
    mapping = {torch.ops.aten.convolution_backward: _conv_backward_flop_with_groups}
    for wrt in ((x,), (w,), (x, w)):
        y = torch.nn.functional.conv2d(x, w, padding=(0, kernel // 2), groups=c)
        with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            torch.autograd.grad(y.sum(), wrt, retain_graph=True)
        assert counter.get_total_flops() == true * len(wrt)
        with FlopCounterMode(display=False) as stock:
            torch.autograd.grad(y.sum(), wrt)
        assert stock.get_total_flops() >= true * len(wrt)


# ----------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"conv_kernel": 32}, "conv_kernel"),
        ({"conv_kernel": -1}, "conv_kernel"),
        ({"pinv_iterations": 0}, "pinv_iterations"),
        ({"num_landmarks": 0}, "num_landmarks"),
        ({"causal": True}, "causal"),
        ({"causal": "yes"}, "causal"),
    ],
)
def test_bad_parameters_are_one_line(params: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as e:
        _layer(**params)
    assert "\n" not in str(e.value)


def test_defaults_and_registry() -> None:
    info = attnbench.info("nystromformer")
    assert info.budget == "num_landmarks" and not info.causal and info.padding_mask
    assert info.params == {
        "num_landmarks": 64, "pinv_iterations": 6, "conv_kernel": 33, "causal": False
    }  # fmt: skip
    layer = _layer(conv_kernel=0)
    assert layer.conv is None
    assert sum(p.numel() for p in layer.parameters()) == 4 * (D * D + D)  # no conv weights
