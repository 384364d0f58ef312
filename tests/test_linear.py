"""linear (Katharopoulos et al. 2020) and the chunked prefix sums it shares with performer.

The references are written here, in float64 and quadratic: φ(Q)φ(K)ᵀ, masked lower-triangular
when causal, each row divided by its sum, with φ(x) = x + 1 for x > 0 and eˣ otherwise (elu + 1
spelled out, not F.elu). The peer, linear-attention-transformer, is held against the shared
prefix sums with its own feature maps.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor

import attnbench
from attnbench.attention.prefix import (
    causal_linear_attention,
    causal_linear_flops,
    linear_attention,
)
from attnbench.measure.flops import count_flops
from attnbench.measure.memory import profiled_peak
from attnbench.registry import info
from tests.conftest import assert_peaks_match_the_profiler

D_MODEL, N_HEADS, N = 32, 4, 23
CHUNKS = (1, 5, 8, 23, 64)  # one position, not dividing n, dividing 24 not 23, = n, > n


def linear(**params: object) -> torch.nn.Module:
    return attnbench.create("linear", d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=64, **params)


def right_padding(lengths: list[int], n: int) -> Tensor:
    """(b, n) bool, True past each row's length."""
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]


def phi(x: Tensor) -> Tensor:
    return torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))


def reference_attention(q_f: Tensor, k_f: Tensor, v: Tensor, causal: bool) -> Tensor:
    """Quadratic: (φ(Q)φ(K)ᵀ ⊙ M) V, rows normalised; 0 where a row has no weight."""
    a = q_f @ k_f.transpose(-2, -1)  # (…, n, n)
    if causal:
        a = a.tril()
    den = a.sum(-1, keepdim=True)
    return torch.where(den == 0, 0.0, a @ v / torch.where(den == 0, 1.0, den))


def reference_layer(layer: torch.nn.Module, x: Tensor, causal: bool) -> Tensor:
    """The whole layer from its weights, in float64."""
    w = {name: getattr(layer, name) for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    x = x.double()
    b, n, _ = x.shape

    def heads(t: Tensor) -> Tensor:
        return t.reshape(b, n, N_HEADS, -1).transpose(1, 2)

    def proj(name: str, t: Tensor) -> Tensor:
        return t @ w[name].weight.double().T + w[name].bias.double()

    q, k, v = (heads(proj(p, x)) for p in ("q_proj", "k_proj", "v_proj"))
    out = reference_attention(phi(q), phi(k), v, causal)
    return proj("out_proj", out.transpose(1, 2).reshape(b, n, D_MODEL))


# --- against the float64 references --------------------------------------------------------


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("causal", [False, True])
def test_layer_equals_the_quadratic_reference(causal: bool, chunk: int) -> None:
    layer = linear(causal=causal, chunk_size=chunk).double()
    x = torch.randn(3, N, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        got = layer(x)
    torch.testing.assert_close(got, reference_layer(layer, x, causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 7, 16, 40])
@pytest.mark.parametrize("m", [5, 24])
def test_prefix_sums_equal_the_masked_quadratic_product(chunk: int, m: int) -> None:
    """Any positive features, m ≠ e (performer's case): the shared function alone."""
    b, h, n, e = 2, 3, 37, 6
    q_f, k_f = torch.rand(2, b, h, n, m, dtype=torch.float64)
    v = torch.randn(b, h, n, e, dtype=torch.float64)
    want = reference_attention(q_f, k_f, v, causal=True)
    torch.testing.assert_close(causal_linear_attention(q_f, k_f, v, chunk), want)
    torch.testing.assert_close(
        linear_attention(q_f, k_f, v), reference_attention(q_f, k_f, v, causal=False)
    )


# --- padding and causality -----------------------------------------------------------------


@pytest.mark.parametrize("chunk", [4, 7, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_is_the_sequence_cut_short(causal: bool, chunk: int) -> None:
    """Right padding, with new (large) values at padded positions: real outputs are those of
    the sequence cut short."""
    layer = linear(causal=causal, chunk_size=chunk).eval()
    n, lengths = 24, [24, 17, 9, 1]
    mask = right_padding(lengths, n)
    x = torch.randn(len(lengths), n, D_MODEL)
    x_other = torch.where(mask[..., None], torch.randn_like(x) * 100, x)
    with torch.no_grad():
        out, out_other = layer(x, mask), layer(x_other, mask)
        for i, length in enumerate(lengths):
            alone = layer(x[i : i + 1, :length])[0]
            torch.testing.assert_close(out[i, :length], alone, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out_other[i, :length], alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk", [2, 5, 64])
def test_causal_left_padding_is_the_sequence_cut_short_and_empty_queries_get_zero(
    chunk: int,
) -> None:
    """Queries before the first real key see none: 0 before out_proj, never NaN; the real
    ones equal the sequence without its leading padding (linear attention has no positions)."""
    layer = linear(causal=True, chunk_size=chunk).eval()
    n, lead = 20, 6
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, :lead] = True
    x = torch.randn(2, n, D_MODEL)
    bad = x.clone()
    bad[0, :lead] = float("nan")  # a padded NaN key or value reaches no real output
    with torch.no_grad():
        inner = layer.attend(x, mask)
        out = layer(x, mask)
        out_bad = layer(bad, mask)
        alone = layer(x[:1, lead:])[0]
    assert torch.equal(inner[0, :lead], torch.zeros(lead, D_MODEL))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, lead:], alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out_bad[~mask], out[~mask])


def test_padding_anywhere_is_invisible() -> None:
    layer = linear().eval()
    mask = torch.rand(3, 20) < 0.4
    mask[:, 5] = False  # every row keeps a key
    x = torch.randn(3, 20, D_MODEL)
    y = torch.where(mask[..., None], torch.randn_like(x) * 1e3, x)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, mask)[~mask], layer(y, mask)[~mask])


@pytest.mark.parametrize("chunk", [1, 4, 5, 64])
def test_causal_ignores_the_future(chunk: int) -> None:
    """Output i must not move when inputs after i do, at chunk boundaries and inside chunks."""
    layer = linear(causal=True, chunk_size=chunk).eval()
    n = 32
    x = torch.randn(2, n, D_MODEL)
    with torch.no_grad():
        out = layer(x)
        for j, scale in ((1, 1.0), (4, 10.0), (5, 1.0), (13, 50.0), (n - 1, 3.0)):
            later = x.clone()
            later[:, j:] = torch.randn(2, n - j, D_MODEL) * scale
            got = layer(later)
            torch.testing.assert_close(got[:, :j], out[:, :j])
            assert not torch.allclose(got[:, j:], out[:, j:])  # the future does reach later


# --- gradients -----------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_reach_every_parameter_and_stay_finite(causal: bool) -> None:
    """With a row whose first queries see no key (causal): their 0 output must not send a
    NaN back through 0/0."""
    layer = linear(causal=causal, chunk_size=4)
    mask = right_padding([16, 11], 16)
    mask[1, :3] = True
    layer(torch.randn(2, 16, D_MODEL), mask).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("chunk", [3, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_the_references(causal: bool, chunk: int) -> None:
    """Input gradients in float64 through the layer and through the quadratic reference."""
    layer = linear(causal=causal, chunk_size=chunk).double()
    x = torch.randn(2, N, D_MODEL, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    weight = torch.randn(2, N, D_MODEL, dtype=torch.float64)
    (layer(x) * weight).sum().backward()
    (reference_layer(layer, x_ref, causal) * weight).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=1e-10)


# --- FLOPs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [{}, {"causal": True}, {"causal": True, "chunk_size": 7}, {"causal": True, "chunk_size": 100}],
    ids=str,
)
@pytest.mark.parametrize("n", [64, 40, 1])
def test_flops_match_the_counter_forward_and_backward(params: dict, n: int) -> None:
    b = 3
    model = attnbench.build_model(
        "linear", layers=2, d_model=D_MODEL, n_heads=N_HEADS, d_ff=48, max_seq_len=64, **params
    ).train()
    x = torch.randn(b, n, D_MODEL, requires_grad=True)
    assert count_flops(model, x) == model.flops(b, n)
    loss = model(x).pow(2).mean()
    assert count_flops(loss.backward) == model.flops_backward(b, n)


def test_causal_flops_count_the_chunks() -> None:
    """By hand: n = 10, chunk 4 gives chunks 4, 4, 2; m = 3, e = 2."""
    m, e = 3, 2
    quadratic = 2 * (16 + 16 + 4) * (m + e)  # scores and scores·V_t per chunk
    carried = 2 * m * (e + 1) * (4 + 2) + 2 * m * e * (4 + 4)  # φ(Q_t)[S z]; φ(K_t)ᵀV_t
    assert causal_linear_flops(10, m, e, 4) == quadratic + carried


# --- half precision ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
def test_half_precision_close_to_fp32(causal: bool, dtype: torch.dtype) -> None:
    n = 512
    layer = attnbench.create(
        "linear", d_model=D_MODEL, n_heads=N_HEADS, max_seq_len=n, causal=causal
    ).eval()
    x = torch.randn(2, n, D_MODEL) * 1.5
    mask = right_padding([n, 300], n)
    with torch.no_grad():
        want = layer(x, mask)
        got = copy.deepcopy(layer).to(dtype)(x.to(dtype), mask)
    assert got.dtype == dtype
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_sums_run_in_fp32(dtype: torch.dtype) -> None:
    """Features of 8 over 2048 positions: the normaliser φ(q)ᵀΣφ(k) reaches 8·8·16·2048 ≈ 2e6,
    past fp16's 65504, and 2048 + 1 is not a bf16 number. Every output is exactly 1·v = 1."""
    n = 2048
    q_f = k_f = torch.full((1, 1, n, 16), 8.0, dtype=dtype)
    v = torch.ones(1, 1, n, 4, dtype=dtype)
    for out in (causal_linear_attention(q_f, k_f, v, 64), linear_attention(q_f, k_f, v)):
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, torch.ones(1, 1, n, 4))


# --- memory --------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [48, 64])
def test_causal_modeled_peak_equals_the_profilers(chunk: int) -> None:
    """The generic memory tests run linear at its defaults (non-causal); the causal loop here,
    forward and training step, within 1 % of the CPU profiler."""
    assert_peaks_match_the_profiler("linear", causal=True, chunk_size=chunk)


def test_causal_forward_never_holds_every_prefix_state() -> None:
    """O(n·d), not O(n·d·d_h): at n = 2048, d = 128, d_h = 64 the tensor of every prefix state
    would be d_h = 64 copies of x; the chunked forward's whole peak (projections, features,
    V' = [V, 1], the chunks' outputs and their cat, out_proj) is about 9.6 copies."""
    n, d, h = 2048, 128, 2
    layer = attnbench.create("linear", d_model=d, n_heads=h, max_seq_len=n, causal=True).eval()
    x = torch.randn(1, n, d)
    with torch.inference_mode():
        layer(x)
        peak = profiled_peak(lambda: layer(x))
    assert peak < 12 * x.nbytes, peak / x.nbytes


# --- the peer: linear-attention-transformer ------------------------------------------------


def test_peer_causal_linear_attention_with_its_features() -> None:
    """The peer's exact causal path (bucket_size=1: cumulative sums over every position) with
    its features φ(q) = softmax(q over features)·e^(-1/2), φ(k) = exp(k), against our prefix
    sums given those features. Its normaliser is clamped at 1e-3, never reached here."""
    from linear_attention_transformer.linear_attention_transformer import causal_linear_attn

    b, h, n, e = 2, 3, 40, 16
    q, k, v = torch.randn(3, b, h, n, e, dtype=torch.float64)
    want = causal_linear_attn(q, k, v, bucket_size=1)
    q_f, k_f = q.softmax(-1) * e**-0.5, k.exp()
    for chunk in (1, 6, 64):
        torch.testing.assert_close(causal_linear_attention(q_f, k_f, v, chunk), want)


def test_peer_non_causal_is_unnormalised_efficient_attention() -> None:
    """The peer's non-causal path (Shen et al.'s efficient attention) has no normaliser: its
    φ(k) = softmax over the sequence makes φ(K)ᵀ1 = 1 and φ(q) = softmax over features sums to
    1, so the normalised form equals it only up to its extra scale d_h^(-1/2)."""
    from linear_attention_transformer.linear_attention_transformer import linear_attn

    b, h, n, e = 2, 3, 40, 16
    q, k, v = torch.randn(3, b, h, n, e, dtype=torch.float64)
    want = linear_attn(q, k, v)
    got = linear_attention(q.softmax(-1), k.softmax(-2), v)
    torch.testing.assert_close(got * e**-0.5, want)


# --- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": 2.5}, "chunk_size"),
        ({"chunk_size": True}, "chunk_size"),
        ({"causal": "yes"}, "causal"),
        ({"k": 64}, "k"),
    ],
)
def test_config_errors_name_the_parameter(params: dict, named: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{named}\b") as e:
        linear(**params)
    assert "\n" not in str(e.value)


def test_registry_metadata() -> None:
    meta = info("linear")
    assert (meta.budget, meta.causal, meta.padding_mask, meta.limits) == (None, True, True, None)
    assert meta.params == {"causal": False, "chunk_size": 64}
    assert meta.unavailable is None
