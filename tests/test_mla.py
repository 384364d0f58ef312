"""Multi-head latent attention (``mla``): the naive and the absorbed forms are one function,
both are the equations of DeepSeek-V2's sec. 2.1 written out here head by head, decoding
over the latent cache is the causal forward, the cache is latent + rope_dim a token, FLOPs
are what FlopCounterMode counts, and bad parameters are one line each.

The registry-wide suites (contract, decode contract, gradients, memory model, context
memory) hold ``mla`` at its defaults; this file holds the other forms and shapes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import attnbench
from attnbench.cell import Cell
from attnbench.measure.flops import count_flops
from tests.profiled import peaks

D, H, N = 32, 4, 24
SMALL = {"latent": 12, "rope_dim": 6}
SHAPES = [  # small dims; a query latent; head widths apart from d/h and from each other
    {**SMALL},
    {**SMALL, "q_latent": 10},
    {**SMALL, "head_dim": 5, "v_head_dim": 7, "q_latent": 9},
]
FP64_TOL = 1e-12


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def pair(params: dict[str, Any], causal: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The naive and the absorbed layer with the same weights, float64, eval."""
    torch.manual_seed(0)
    kw = {"d_model": D, "n_heads": H, "max_seq_len": N, "causal": causal, **params}
    naive = attnbench.create("mla", form="naive", **kw).double().eval()
    absorbed = attnbench.create("mla", form="absorbed", **kw).double().eval()
    absorbed.load_state_dict(naive.state_dict())
    return naive, absorbed


def reference(m: Any, x: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """DeepSeek-V2's eqs. (9)-(19) for one layer, float64, head by head and token by token:
    c = RMSNorm(W_DKV x), k_C = W_UK c, v = W_UV c, k_R = RoPE(W_KR x), q = [q_C, RoPE(q_R)],
    o = Σ softmax(q·k / √(d_h + d_R)) v, then W_O. RoPE as a 2 × 2 rotation of each pair
    (x_j, x_{j + r/2}) by t·10000^(−2j/r), built element by element."""
    p = {k: v.double() for k, v in m.state_dict().items()}
    cfg, h = m.cfg, m.n_heads
    dn, dr, dv, lat = m.nope_dim, cfg.rope_dim, m.v_dim, cfg.latent

    def linear(name: str, t: torch.Tensor) -> torch.Tensor:
        out = t @ p[f"{name}.weight"].T
        return out + p[f"{name}.bias"] if f"{name}.bias" in p else out

    def rms(name: str, t: torch.Tensor) -> torch.Tensor:
        return t / torch.sqrt(t.square().mean(-1, keepdim=True) + 1e-6) * p[f"{name}.weight"]

    def rotate(t: torch.Tensor, pos: int) -> torch.Tensor:
        r, out = t.shape[-1], t.clone()
        for j in range(r // 2):
            a = pos * 10000.0 ** (-2 * j / r)
            out[j] = t[j] * math.cos(a) - t[j + r // 2] * math.sin(a)
            out[j + r // 2] = t[j] * math.sin(a) + t[j + r // 2] * math.cos(a)
        return out

    b, n, _ = x.shape
    out = torch.zeros(b, n, h * dv, dtype=torch.float64)
    for s in range(b):
        xs = x[s].double()
        q_in = rms("q_norm", linear("q_down", xs)) if cfg.q_latent else xs
        q_all = linear("q_proj", q_in).view(n, h, dn + dr)
        kv = linear("kv_down", xs)
        c = torch.stack([rms("kv_norm", kv[t, :lat]) for t in range(n)])  # (n, latent)
        k_r = torch.stack([rotate(kv[t, lat:], t) for t in range(n)])  # (n, d_R)
        up = (c @ p["kv_up.weight"].T).view(n, h, dn + dv)
        for i in range(h):
            keys = torch.cat((up[:, i, :dn], k_r), dim=-1)  # (n, d_h + d_R)
            values = up[:, i, dn:]  # (n, d_v)
            for t in range(n):
                q = torch.cat((q_all[t, i, :dn], rotate(q_all[t, i, dn:], t)))
                seen = [
                    j
                    for j in range(n)
                    if not (mask is not None and mask[s, j]) and not (causal and j > t)
                ]
                if not seen:
                    continue  # a query that sees nothing: 0 before W_O
                w = (keys[seen] @ q / math.sqrt(dn + dr)).softmax(-1)
                out[s, t, i * dv : (i + 1) * dv] = w @ values[seen]
    return linear("out_proj", out)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("params", SHAPES, ids=str)
def test_naive_and_absorbed_are_the_papers_equations_in_float64(
    params: dict[str, Any], causal: bool
) -> None:
    """Both forms against the equations written out by hand, and against each other, with
    a padded sequence beside an unpadded one. Measured over these cases and seeds 10-12
    (outputs up to 1.04): max |naive − absorbed| 2.8e-16, either against the hand-written
    equations 3.3e-16."""
    naive, absorbed = pair(params, causal)
    x = torch.randn(2, N, D, dtype=torch.float64)
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[1, 17:] = True
    with torch.inference_mode():
        y_naive, y_absorbed = naive(x, mask), absorbed(x, mask)
    want = reference(naive, x, mask, causal)
    assert (y_naive - y_absorbed).abs().max().item() < FP64_TOL
    assert (y_naive - want).abs().max().item() < FP64_TOL
    assert (y_absorbed - want).abs().max().item() < FP64_TOL


@pytest.mark.parametrize("form", ["naive", "absorbed"])
@pytest.mark.parametrize("params", SHAPES, ids=str)
def test_prefill_then_decode_over_the_latent_cache_is_the_forward_in_float64(
    params: dict[str, Any], form: str
) -> None:
    """A prompt prefilled whole and in pieces, then one token at a time through the absorbed
    form over the cache, equals the causal forward of either form (positions continue from
    the cache's length). Measured max |error| over these cases: 3.3e-16 (float32: 1.3e-7)."""
    torch.manual_seed(1)
    m = attnbench.create(
        "mla", d_model=D, n_heads=H, max_seq_len=N, causal=True, form=form, **params
    )
    m = m.double().eval()
    x = torch.randn(2, N, D, dtype=torch.float64)
    with torch.inference_mode():
        want = m(x)
        for pieces in ([9], [4, 4, 1], [1]):
            state = m.new_state(2, N + 3, torch.float64, torch.device("cpu"))
            sizes, outs, start = [*pieces, *[1] * (N - sum(pieces))], [], 0
            for size in sizes:
                outs.append(m.extend(x[:, start : start + size], state))
                start += size
            error = (torch.cat(outs, dim=1) - want).abs().max().item()
            assert error < FP64_TOL, (pieces, error)


def test_the_cache_is_one_latent_and_one_rope_key_a_token() -> None:
    """Whatever the heads: (b, 1, capacity, latent) and (b, 1, capacity, rope_dim), filled
    up to the tokens seen; context_elements(n) = n · (latent + rope_dim) a layer, and
    state_bytes that plus a padding flag a token."""
    m = attnbench.create(
        "mla", d_model=D, n_heads=H, max_seq_len=N, causal=True, head_dim=5, **SMALL
    )
    state = m.new_state(3, 20, torch.float32, torch.device("cpu"))
    assert state.k.shape == (3, 1, 20, 12) and state.v.shape == (3, 1, 20, 6)
    with torch.inference_mode():
        m.extend(torch.randn(3, 7, D), state)
    assert state.length == 7 and state.k[:, :, 7:].abs().sum() == 0
    assert state.k[:, :, :7].abs().sum() > 0 and state.v[:, :, :7].abs().sum() > 0
    for n in (1, 7, 20):
        assert m.context_elements(n) == n * (12 + 6)
        assert m.state_bytes(n, 2) == 2 * n * 18 + n


def test_deepseek_v2s_cache_against_its_multi_head_equivalent() -> None:
    """DeepSeek-V2 (arXiv:2405.04434: its shape in sec. 3.1.2, the cache count in Table 1):
    60 layers, 128 heads of d_h = 128, latent 512 = 4 d_h, RoPE 64 = d_h / 2, query latent
    1536. It keeps 576 elements a token and layer, 34 560 over the model; the multi-head
    layer of those heads keeps 2 · 128 · 128 = 32 768, 1 966 080 over 60 layers (built on
    meta: no weights)."""
    shape = {"layers": 60, "d_model": 5120, "n_heads": 128, "d_ff": 64, "max_seq_len": 8}
    mla = {"latent": 512, "rope_dim": 64, "head_dim": 128, "v_head_dim": 128, "q_latent": 1536}
    with torch.device("meta"):
        v2 = attnbench.build_model("mla", causal=True, **shape, **mla)
        mha = attnbench.build_model("vanilla", causal=True, **{**shape, "d_model": 128 * 128})
    assert v2.layer_context_elements(1)[0] == 576
    assert mha.layer_context_elements(1)[0] == 32_768
    assert v2.context_elements(1) == 34_560 and mha.context_elements(1) == 1_966_080
    assert v2.context_elements(1000) == 34_560_000


@pytest.mark.parametrize("form", ["naive", "absorbed"])
@pytest.mark.parametrize("params", SHAPES, ids=str)
def test_flops_are_what_flop_counter_mode_counts(params: dict[str, Any], form: str) -> None:
    """Forward and backward of a 2-layer model, and one decode step of a layer (absorbed
    whatever ``form``), at a length that is not the other dims (so a swapped factor would
    show)."""
    b, n = 3, 19
    model = attnbench.build_model(
        "mla", layers=2, d_model=D, n_heads=H, d_ff=48, max_seq_len=N, form=form, **params
    )
    x = torch.randn(b, n, D, requires_grad=True)
    assert count_flops(model, x) == model.flops(b, n)
    loss = model(x).sum()
    assert count_flops(loss.backward) == model.flops_backward(b, n)
    # and the backward reaches every parameter of either form (the registry's test: naive)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    layer = attnbench.create(
        "mla", d_model=D, n_heads=H, max_seq_len=N, causal=True, form=form, **params
    )
    with torch.inference_mode():
        state = layer.new_state(b, N, torch.float32, torch.device("cpu"))
        layer.extend(torch.randn(b, n - 1, D), state)
        assert count_flops(layer.extend, torch.randn(b, 1, D), state) == layer.step_flops(b, n)


def test_the_absorbed_forms_scores_cost_more_than_the_naive_ones_at_the_defaults() -> None:
    """At the base model's shape (12 heads of 64, latent 256, RoPE 32) the absorbed form's
    scores run over latent + rope = 288 dims against 96 and its P·V over 256 against 64:
    why prefill defaults to naive. Its per-token up-projections cost the same."""
    kw = {"d_model": 768, "n_heads": 12, "max_seq_len": 4096}
    with torch.device("meta"):
        naive = attnbench.create("mla", **kw)
        absorbed = attnbench.create("mla", form="absorbed", **kw)
    n = 4096
    up = 2 * n * 256 * 12 * 128
    assert naive.attention_flops(1, n) == up + 2 * n * n * 12 * (96 + 64)
    assert absorbed.attention_flops(1, n) == up + 2 * n * n * 12 * (288 + 256)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"latent": 0}, "latent: must be an integer >= 1, got 0"),
        ({"latent": 2.5}, "latent: must be an integer >= 1, got 2.5"),
        ({"rope_dim": 0}, "rope_dim: must be an integer >= 2, got 0"),
        ({"rope_dim": 5}, "rope_dim: must be an even integer >= 2 (RoPE rotates pairs), got 5"),
        ({"head_dim": 0}, "head_dim: must be an integer >= 1, got 0"),
        ({"v_head_dim": "8"}, "v_head_dim: must be an integer >= 1 or null"),
        ({"q_latent": -1}, "q_latent: must be an integer >= 0, got -1"),
        ({"form": "fused"}, "form: must be one of naive, absorbed; got 'fused'"),
        ({"causal": 1}, "causal: must be true or false, got 1"),
    ],
    ids=str,
)
def test_bad_parameters_are_one_line_naming_them(params: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError) as e:
        attnbench.create("mla", d_model=D, n_heads=H, max_seq_len=N, **params)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_the_absorbed_forms_memory_is_what_the_profiler_sees() -> None:
    """The registry-wide memory test runs the default (naive) form; the absorbed form's
    stacked heads and in-place score sum, against the CPU profiler within 1 %."""
    n, d = 256, 128
    cell = Cell.of(
        "mla", n=n, dtype="fp32", device="cpu", layers=2, d_model=d, n_heads=4, d_ff=256,
        params=(("form", "absorbed"), ("latent", 64), ("rope_dim", 16)),
    )  # fmt: skip
    for b in (1, 3):
        modeled, real = peaks(cell, b)
        assert abs(modeled - real) <= 0.01 * real, (b, modeled, real)
