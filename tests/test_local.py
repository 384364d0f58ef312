"""local: sliding-window attention against references it does not share code with.

The reference is written here: the layer's own weights in float64, the dense n × n scores
masked to the band (non-causal |i − j| ≤ w/2, causal i − w < j ≤ i) and to the padding, a
plain softmax, and 0 for a query that sees no key (as sdpa gives). The blocked layer must
equal it to float rounding whatever n is against its block size. Beside it: vanilla attention
(window ≥ n), the public ``local-attention`` package with the same projections, the FLOP
counter on a forward and a backward, and the memory tracker (O(n·w), no n × n matrix).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import attnbench
from attnbench.attention.local import layout
from attnbench.measure.flops import count_flops
from attnbench.measure.memory import tracked_peak

D, H = 32, 4


def _local(n: int, window: int, causal: bool = False) -> torch.nn.Module:
    return attnbench.create(
        "local", d_model=D, n_heads=H, max_seq_len=n, window=window, causal=causal
    ).eval()


def _reference(
    m: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None, window: int, causal: bool
) -> torch.Tensor:
    """softmax(QKᵀ/√dh + band and padding mask) V in float64, then out_proj; (b, n, D)."""
    m64, x = copy.deepcopy(m).double(), x.double()
    b, n, _ = x.shape

    def heads(lin: torch.nn.Linear) -> torch.Tensor:
        return (x @ lin.weight.T + lin.bias).view(b, n, H, D // H).transpose(1, 2)

    q, k, v = heads(m64.q_proj), heads(m64.k_proj), heads(m64.v_proj)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    band = (i - j >= 0) & (i - j < window) if causal else (i - j).abs() <= window // 2
    allowed = band.expand(b, 1, n, n)
    if mask is not None:
        allowed = allowed & ~mask[:, None, None, :]
    scores = (q @ k.transpose(-2, -1)) / (D // H) ** 0.5
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    probs = probs.masked_fill(~allowed.any(-1, keepdim=True), 0.0)  # no key: 0, as sdpa
    out = (probs @ v).transpose(1, 2).reshape(b, n, D)
    return out @ m64.out_proj.weight.T + m64.out_proj.bias


CASES = [  # (n, window): block B = max(w/2, 32), so n below, at and off a multiple of B
    (64, 64),
    (100, 64),  # B = 32, n not a multiple
    (37, 8),  # tiny window, B = 32
    (300, 256),  # the default window, B = 128, 3 blocks, the last partial
    (5, 64),  # one block shorter than the window
    (130, 2),  # w = 2: one key on each side
]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize(("n", "window"), CASES, ids=str)
def test_equals_the_float64_band_reference(n: int, window: int, causal: bool) -> None:
    m = _local(n, window, causal)
    x = torch.randn(2, n, D)
    mask = torch.rand(2, n) < 0.25
    mask[1] = False
    for key_padding_mask in (None, mask):
        with torch.inference_mode():
            got = m(x, key_padding_mask)
        want = _reference(m, x, key_padding_mask, window, causal)
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_the_window_is_exactly_as_documented(causal: bool) -> None:
    """Moving one key changes query i's output exactly when it lies in i's window:
    non-causal |i − j| ≤ w/2 (w + 1 keys), causal i − w < j ≤ i (w keys)."""
    n, w, i = 96, 10, 50
    m = _local(n, w, causal)
    inside = range(i - w + 1, i + 1) if causal else range(i - w // 2, i + w // 2 + 1)
    x = torch.randn(1, n, D)
    with torch.inference_mode():
        base = m(x)[0, i]
        for j in range(n):
            y = x.clone()
            y[0, j] += 1.0
            moved = not torch.equal(m(y)[0, i], base)
            assert moved == (j in inside), (j, moved)
    assert len(inside) == (w if causal else w + 1)


@pytest.mark.parametrize(("causal", "window"), [(False, 2 * 47), (False, 512), (True, 48)])
def test_a_window_covering_the_sequence_is_vanilla(causal: bool, window: int) -> None:
    """w ≥ n (non-causal: w/2 ≥ n − 1) leaves no key out: vanilla attention, with the same
    weights, padding mask and all."""
    n = 48
    m = _local(n, window, causal)
    vanilla = attnbench.create("vanilla", d_model=D, n_heads=H, max_seq_len=n, causal=causal)
    vanilla.load_state_dict(m.state_dict())
    x = torch.randn(3, n, D)
    mask = torch.zeros(3, n, dtype=torch.bool)
    mask[0, 30:], mask[1, 3::4] = True, True
    with torch.inference_mode():
        for key_padding_mask in (None, mask):
            torch.testing.assert_close(m(x, key_padding_mask), vanilla.eval()(x, key_padding_mask))


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_padding_is_the_sequence_cut_short(causal: bool) -> None:
    """Off a block boundary too (n = 100, real 77, B = 32), and batched with a full row."""
    n, real = 100, 77
    m = _local(n, 40, causal)
    x = torch.randn(2, n, D)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, real:] = True
    with torch.inference_mode():
        padded = m(x, mask)
        torch.testing.assert_close(padded[0, :real], m(x[:1, :real])[0])
        torch.testing.assert_close(padded[1], m(x[1:])[0])


def test_a_query_whose_window_is_all_padding_gives_zero() -> None:
    """Before out_proj its output is 0, as sdpa and vanilla give, not NaN; its neighbours
    are untouched."""
    n, w = 64, 4
    for causal, hole in ((False, slice(10, 21)), (True, slice(0, 7))):
        m = _local(n, w, causal)
        mask = torch.zeros(2, n, dtype=torch.bool)
        mask[0, hole] = True
        x = torch.randn(2, n, D)
        with torch.inference_mode():
            inner = m.attend(x, mask)
        empty = [15] if not causal else [0, 3, 6]  # windows [13, 17] and (i − 4, i]
        assert torch.isfinite(inner).all()
        assert inner[0, empty].abs().max() == 0
        want = _reference(m, x, mask, w, causal)
        torch.testing.assert_close(m(x, mask).double(), want, atol=2e-6, rtol=1e-5)


def test_non_finite_values_at_padded_positions_do_not_leak() -> None:
    """Padded keys and values are zeroed before use, so even inf or NaN there is harmless."""
    n = 70
    m = _local(n, 16)
    x = torch.randn(2, n, D)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, 50:], mask[1, 20:30] = True, True
    bad = x.clone()
    bad[0, 50:], bad[1, 20:30] = float("inf"), float("nan")
    with torch.inference_mode():
        torch.testing.assert_close(m(bad, mask)[~mask], m(x, mask)[~mask])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_with_padding_and_a_partial_block(dtype: torch.dtype) -> None:
    n = 100
    m = _local(n, 64, causal=True)
    x = torch.randn(2, n, D)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, 80:] = True
    want = _reference(m, x, mask, 64, True)
    with torch.inference_mode():
        got = m.to(dtype)(x.to(dtype), mask)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double()[~mask], want[~mask], atol=0.05, rtol=0.05)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize(("n", "window"), [(64, 16), (100, 64), (40, 512), (33, 2)], ids=str)
def test_flops_count_what_the_blocks_compute(n: int, window: int, causal: bool) -> None:
    """Forward and backward against FlopCounterMode. Whole blocks are multiplied, masked
    parts included, so the count exceeds the band's ideal 4·n·w·d (checked too)."""
    b = 2
    model = attnbench.build_model(
        "local", layers=2, d_model=D, n_heads=H, d_ff=48, max_seq_len=n, window=window,
        causal=causal,
    ).train()  # fmt: skip
    x = torch.randn(b, n, D, requires_grad=True)
    forward = count_flops(model, x)
    assert forward == model.flops(b, n)
    loss = model(x).pow(2).mean()
    assert count_flops(loss.backward) == model.flops_backward(b, n)
    keys = min(window if causal else window + 1, n)
    assert model.layers[0].attn.attention_flops(b, n) >= 4 * b * n * keys * D


def test_layout_covers_every_window() -> None:
    """For each query block, the key blocks it attends hold every key of its queries'
    windows, and the look-around is never wider than the sequence."""
    for causal in (False, True):
        for w in (2, 8, 64, 100, 256, 1000):
            if not causal and w % 2:
                continue
            for n in (1, 31, 32, 100, 4096):
                block, blocks, back, forward = layout(w, causal, n)
                assert blocks * block >= n > (blocks - 1) * block
                assert back <= blocks - 1 and forward <= blocks - 1
                lo, hi = (w - 1, 0) if causal else (w // 2, w // 2)
                assert back * block >= min(lo, (blocks - 1) * block)
                assert forward * block >= min(hi, (blocks - 1) * block)


def test_memory_grows_linearly_in_n() -> None:
    """The forward's modeled peak (meta tensors) at 2n is twice that at n, within a few
    percent: O(n·w). Vanilla's, with its n × n scores, grows far faster."""

    def peak(name: str, n: int, **params: object) -> int:
        with torch.device("meta"):
            m = attnbench.create(name, d_model=64, n_heads=4, max_seq_len=n, **params)
        x = torch.empty(1, n, 64, device="meta")
        return tracked_peak(lambda: m(x), 0)

    small, large = peak("local", 2048, window=64), peak("local", 4096, window=64)
    assert 1.9 * small <= large <= 2.1 * small
    assert peak("vanilla", 4096) > 3 * peak("vanilla", 2048)


def test_bad_windows_are_one_line_naming_the_parameter() -> None:
    for bad in (0, -2, 2.0, "64", True):
        with pytest.raises(ValueError, match="window") as e:
            _local(32, bad)  # type: ignore[arg-type]
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="window: must be even when causal=false") as e:
        _local(32, 7)
    assert "\n" not in str(e.value)
    _local(32, 7, causal=True)  # causal: the 7 keys up to i, any w
    assert attnbench.info("local").budget == "window"
    assert attnbench.info("local").params == {
        "window": 256,
        "causal": False,
        "gate": "none",
        "sinks": False,
    }


# --- the public peer: local-attention (lucidrains), with our projections around it --------


def _peer_layer(m: torch.nn.Module, peer: torch.nn.Module, x: torch.Tensor, mask=None):
    q, k, v = m.qkv_heads(x)  # (b, h, n, dh): the peer folds (b, h) into one batch
    keep = None if mask is None else ~mask
    return m.out_proj(m.merge_heads(peer(q, k, v, mask=keep)))


def test_the_peer_with_an_exact_window_agrees() -> None:
    """local_attention.LocalAttention(window_size=w/2, look_backward=1, look_forward=1,
    exact_windowsize=True) masks to i − w/2 ≤ j ≤ i + w/2: our non-causal band. Causal, its
    exact window is i − window_size·look_backward ≤ j ≤ i, so window_size = w − 1 is ours."""
    la = pytest.importorskip("local_attention")
    n, w = 96, 32
    x = torch.randn(2, n, D)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, 70:] = True
    ours = _local(n, w)
    peer = la.LocalAttention(
        window_size=w // 2, look_backward=1, look_forward=1, exact_windowsize=True
    )
    ours_causal = _local(n, w, causal=True)
    peer_causal = la.LocalAttention(
        window_size=w - 1, causal=True, look_backward=1, exact_windowsize=True, autopad=True
    )
    with torch.inference_mode():
        for m, p in ((ours, peer), (ours_causal, peer_causal)):
            torch.testing.assert_close(m(x), _peer_layer(m, p, x))
            torch.testing.assert_close(m(x, mask)[~mask], _peer_layer(m, p, x, mask)[~mask])


def test_the_peer_by_default_attends_whole_blocks() -> None:
    """Without exact_windowsize the peer's window is block-shaped: a query sees the whole of
    its own and the neighbouring blocks (2 to 3 block widths, depending on where it sits in
    its block), not a band, so it differs from ours and from the float64 band reference."""
    la = pytest.importorskip("local_attention")
    n, w = 96, 32
    ours = _local(n, w)
    peer = la.LocalAttention(window_size=w // 2, look_backward=1, look_forward=1)
    x = torch.randn(1, n, D)
    with torch.inference_mode():
        diff = (ours(x) - _peer_layer(ours, peer, x)).abs().amax(-1)[0]
    assert (diff > 1e-3).float().mean() > 0.5
    torch.testing.assert_close(
        ours(x).double(), _reference(ours, x, None, w, False), atol=2e-6, rtol=1e-5
    )


def test_meta_forward_with_padding_and_batches() -> None:
    with torch.device("meta"):
        m = attnbench.create("local", d_model=D, n_heads=H, max_seq_len=100, window=64)
    x = torch.empty(3, 100, D, device="meta", dtype=torch.bfloat16)
    mask = torch.empty(3, 100, dtype=torch.bool, device="meta")
    with torch.inference_mode():
        y = m.to(torch.bfloat16)(x, mask)
    assert y.shape == (3, 100, D) and y.device.type == "meta"


def test_sdpa_is_what_runs() -> None:
    """The fused kernel with our additive mask: the same as an eager masked softmax."""
    n, w = 100, 64
    m = _local(n, w)
    x = torch.randn(1, n, D)
    block, blocks, back, forward = layout(w, False, n)
    bias = m.band_mask(n, None, x)
    assert bias.shape == (blocks, 1, block, (1 + back + forward) * block)
    assert bias.dtype == x.dtype and set(bias.unique().tolist()) == {0.0, float("-inf")}
    with torch.inference_mode():
        q = torch.randn(blocks, H, block, D // H)
        kv = torch.randn(blocks, H, bias.shape[-1], D // H)
        eager = ((q @ kv.transpose(-2, -1)) / (D // H) ** 0.5 + bias).softmax(-1) @ kv
        torch.testing.assert_close(F.scaled_dot_product_attention(q, kv, kv, bias), eager)
