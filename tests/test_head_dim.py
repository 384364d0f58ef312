"""The attention's own width (``model.head_dim``): heads of head_dim over any d_model, as
Qwen3-Next's 16 heads of 256 over 2048. The layer is the equations written out here in
float64, its FLOPs are what FlopCounterMode counts, its cache is 2·kv_heads·head_dim a
token, a decode over it is the forward, its memory is what the profiler sees, its key is
apart from the same cell at d_model / n_heads, and a mechanism without a width of its own
refuses it in one line."""

from __future__ import annotations

import pytest
import torch

import attnbench
from attnbench.cell import Cell
from attnbench.cell_key import key
from attnbench.measure import presets
from attnbench.measure.flops import count_flops
from attnbench.plan import validate
from tests.profiled import peaks

D, H, DH, KV, N = 24, 4, 10, 2, 13  # width 40 over d_model 24: neither divides the other
WIDE = ("vanilla", "sdpa", "local", "flex")  # on a CPU; xformers runs on CUDA only


def layer(name: str, causal: bool = False, **params: object) -> torch.nn.Module:
    """``name`` with heads of DH over D, grouped (KV key/value heads)."""
    torch.manual_seed(0)
    kw = {"d_model": D, "n_heads": H, "kv_heads": KV, "head_dim": DH, "max_seq_len": N}
    if name == "local":
        params = {"window": 2 * N, **params}  # a band wider than n: softmax over every key
    return attnbench.create(name, causal=causal, **kw, **params).double().eval()


def written_out(m: torch.nn.Module, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q_i · k_j / √head_dim) v_j per head, K and V of head i // (H / KV), then
    out_proj: the layer as its equations say, head by head."""
    b, n, _ = x.shape
    kv = m.kv_heads
    q = (x @ m.q_proj.weight.T + m.q_proj.bias).view(b, n, H, DH)
    k = (x @ m.k_proj.weight.T + m.k_proj.bias).view(b, n, kv, DH)
    v = (x @ m.v_proj.weight.T + m.v_proj.bias).view(b, n, kv, DH)
    heads = []
    for h in range(H):
        g = h // (H // kv)
        scores = torch.einsum("bid,bjd->bij", q[:, :, h], k[:, :, g]) / DH**0.5
        if causal:
            scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        heads.append(scores.softmax(-1) @ v[:, :, g])
    return torch.cat(heads, dim=-1) @ m.out_proj.weight.T + m.out_proj.bias


@pytest.mark.parametrize("name", WIDE)
@pytest.mark.parametrize("causal", [False, True])
def test_heads_of_their_own_width_are_the_equations(name: str, causal: bool) -> None:
    m = layer(name, causal)
    assert m.q_proj.weight.shape == (H * DH, D) and m.out_proj.weight.shape == (D, H * DH)
    x = torch.randn(2, N, D, dtype=torch.float64)
    if name == "flex":  # its CPU kernel runs fp32 (tests/test_flex.py): the tolerance of fp32
        m, x = m.float(), x.float()
    with torch.no_grad():  # flex has no CPU backward: no graph for it
        got, want = m(x), written_out(m.double(), x.double(), causal)
    assert (got.double() - want).abs().max() < (1e-5 if name == "flex" else 1e-12)


@pytest.mark.parametrize("name", ["vanilla", "sdpa", "local"])
def test_a_decode_over_the_wider_cache_is_the_forward(name: str) -> None:
    """The cache is 2·kv_heads·head_dim a token; prefill then one token at a time equals the
    causal forward in float64."""
    m = layer(name, causal=True)
    assert m.context_elements(N) == 2 * m.kv_heads * DH * N
    x = torch.randn(2, N, D, dtype=torch.float64)
    state = m.new_state(2, N, torch.float64, torch.device("cpu"))
    out = [m.extend(x[:, :5], state), m.extend(x[:, 5:9], state)]  # a prefill in two chunks
    out += [m.extend(x[:, t : t + 1], state) for t in range(9, N)]
    assert (torch.cat(out, dim=1) - m(x)).abs().max() < 1e-12


def test_flops_with_a_gate_are_what_flop_counter_mode_counts() -> None:
    """Forward, backward and a decode step of a model whose heads are 10 wide over d_model
    24, with an elementwise output gate (as wide as the heads together)."""
    model = attnbench.build_model(
        "vanilla", layers=2, d_model=D, n_heads=H, kv_heads=KV, head_dim=DH, d_ff=32,
        max_seq_len=N, causal=True, gate="elementwise",
    )  # fmt: skip
    b, n = 3, 11
    x = torch.randn(b, n, D, requires_grad=True)
    assert count_flops(model, x) == model.flops(b, n)
    loss = model(x).sum()
    assert count_flops(loss.backward) == model.flops_backward(b, n)
    one = model.layers[0].attn
    with torch.inference_mode():
        state = one.new_state(b, N, torch.float32, torch.device("cpu"))
        one.extend(torch.randn(b, n - 1, D), state)
        assert count_flops(one.extend, torch.randn(b, 1, D), state) == one.step_flops(b, n)


def test_the_modeled_peak_is_the_profilers() -> None:
    """vanilla's, whose every op the tracker sees (sdpa's CPU kernel at a head width apart
    from d_model / n_heads is modeled up to 15 % high: docs/mechanisms.md)."""
    n, d = 256, 64
    cell = Cell.of(
        "vanilla", n=n, dtype="fp32", device="cpu", layers=2, d_model=d, n_heads=4, head_dim=48,
        kv_heads=2, d_ff=128,
    )  # fmt: skip
    modeled, real = peaks(cell, 2)
    assert abs(modeled - real) <= 0.01 * real, (modeled, real)


def test_a_width_of_its_own_is_keyed_and_the_default_keys_as_before() -> None:
    v100 = presets.load("v100_16gb")
    plain = Cell.of("vanilla", 512)
    assert key(Cell.of("vanilla", 512, head_dim=64), v100) == key(plain, v100)  # 768 / 12
    assert key(Cell.of("vanilla", 512, head_dim=128), v100) != key(plain, v100)
    assert Cell.of("vanilla", 512, head_dim=128).model.shape["head_dim"] == 128
    assert "head_dim" not in plain.model.shape


def test_a_mechanism_without_a_width_of_its_own_refuses_it_in_one_line() -> None:
    with pytest.raises(ValueError) as e:
        validate(Cell.of("linformer", 512, k=128, head_dim=128))
    assert str(e.value).startswith(
        "head_dim: attention=linformer has no width of its own; head_dim works with vanilla, "
        "sdpa, xformers, local, flex, mla (null: d_model / n_heads)"
    )
