"""local with grouped-query heads (``kv_heads``): what gpt-oss's sliding layers run.

A layer with ``kv_heads`` = g key/value heads must compute exactly what a layer of as many
key/value heads as query heads computes when each of its K/V heads is the g-head layer's
repeated over its group (the definition of grouped-query attention, Ainslie et al. 2023):
here the full layer is built with ``k_proj``/``v_proj`` rows copied group by group, and the
two are compared in float64, forward (bidirectional and causal, padded, packed) and with
sinks and a gate. Its incremental form (the ring of ``kv_heads`` heads) must equal its
forward, and its state is counted by hand.
"""

from __future__ import annotations

import pytest
import torch

import attnbench
from attnbench.attention.packing import Packing
from attnbench.measure.flops import count_flops

D, H, KV = 32, 8, 2  # 4 query heads per key/value head
DH = D // H
TOL = 1e-12
DECODE_TOL = 1e-10


def _pair(
    n: int, window: int, causal: bool, **options: object
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A float64 layer of KV key/value heads, and one of H whose K/V heads are its heads
    repeated over their groups (every other weight shared)."""
    torch.manual_seed(3)
    kw = {"d_model": D, "n_heads": H, "max_seq_len": n, "window": window, "causal": causal}
    grouped = attnbench.create("local", kv_heads=KV, **kw, **options).double().eval()
    full = attnbench.create("local", **kw, **options).double().eval()
    state = grouped.state_dict()
    for name in ("k_proj", "v_proj"):  # rows of head i serve query heads i·g … i·g + g − 1
        w, b = state[f"{name}.weight"], state[f"{name}.bias"]
        state[f"{name}.weight"] = w.view(KV, DH, D).repeat_interleave(H // KV, 0).reshape(D, D)
        state[f"{name}.bias"] = b.view(KV, DH).repeat_interleave(H // KV, 0).reshape(D)
    if "sinks" in state:  # learned, so that a wrong head's sink would show
        state["sinks"] = torch.randn(H, dtype=torch.float64)
        grouped.sinks.data.copy_(state["sinks"])
    full.load_state_dict(state)
    return grouped, full


OPTIONS = [{}, {"sinks": True}, {"sinks": True, "gate": "headwise"}]


@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "sinks", "sinks+gate"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_grouped_heads_are_k_and_v_repeated(causal: bool, options: dict) -> None:
    """n = 100 against a window of 16 (blocks of 32, the last partial), with padding."""
    n = 100
    m, full = _pair(n, 16, causal, **options)
    assert m.k_proj.out_features == KV * DH and full.k_proj.out_features == D
    x = torch.randn(2, n, D, dtype=torch.float64)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, 70:] = True
    mask[0, 5:9] = True
    with torch.inference_mode():
        for key_padding_mask in (None, mask):
            error = (m(x, key_padding_mask) - full(x, key_padding_mask)).abs().max().item()
            assert error < TOL, (causal, options, key_padding_mask is not None, error)
        packing = Packing.of([(40, 60), (7, 80, 13)])
        error = (m(x, packing=packing) - full(x, packing=packing)).abs().max().item()
        assert error < TOL, (causal, options, "packed", error)


@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "sinks", "sinks+gate"])
def test_prefill_then_decode_equals_the_forward(options: dict) -> None:
    """A prompt of 21 (then one of 5 after it, through the ring), then one token at a
    time past the window of 8: every output equals the causal forward's."""
    n = 45
    m, _ = _pair(n, 8, True, **options)
    if m.sinks is not None:
        m.sinks.data.normal_()
    x = torch.randn(2, n, D, dtype=torch.float64)
    with torch.inference_mode():
        want = m(x)
        state = m.new_state(2, n, torch.float64, x.device)
        assert state.k.shape == (2, KV, 8, DH)  # the ring holds the kv_heads heads only
        outs = [m.extend(x[:, :21], state), m.extend(x[:, 21:26], state)]
        outs += [m.extend(x[:, i : i + 1], state) for i in range(26, n)]
    error = (torch.cat(outs, dim=1) - want).abs().max().item()
    assert error < DECODE_TOL, (options, error)


@pytest.mark.parametrize("n", [1, 5, 16, 17, 4096])
def test_state_bytes_by_hand(n: int) -> None:
    """The ring: 2 · kv_heads · d_h · min(w, n) keys and values, a padding flag a slot."""
    m = attnbench.create(
        "local", d_model=D, n_heads=H, kv_heads=KV, max_seq_len=n, window=16, causal=True
    )
    slots = min(16, n)
    assert m.context_elements(n) == 2 * KV * DH * slots
    assert m.state_bytes(n, 2) == 2 * KV * DH * slots * 2 + slots
    state = m.new_state(1, n, torch.bfloat16, torch.device("cpu"))
    held = sum(t.numel() * t.element_size() for t in (state.k, state.v, state.padded))
    assert held == m.state_bytes(n, 2)


@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
def test_flops_are_flop_counter_modes_and_only_the_projections_shrink(sinks: bool) -> None:
    """Forward and backward against FlopCounterMode; against full heads, K and V project to
    kv_heads·d_h instead of d: 2 matmuls of 2·b·n·d·(h − kv_heads)·d_h fewer, the attention
    (counted per query head) unchanged."""
    b, n = 2, 100
    kw = {"d_model": D, "n_heads": H, "d_ff": 48, "max_seq_len": n, "window": 16}
    kw |= {"causal": True, "sinks": sinks}
    model = attnbench.build_model("local", layers=1, kv_heads=KV, **kw).train()
    full = attnbench.build_model("local", layers=1, **kw)
    x = torch.randn(b, n, D, requires_grad=True)
    assert count_flops(model, x) == model.flops(b, n)
    loss = model(x).pow(2).mean()
    assert count_flops(loss.backward) == model.flops_backward(b, n)
    assert full.flops(b, n) - model.flops(b, n) == 2 * 2 * b * n * D * (H - KV) * DH
    attn, full_attn = model.layers[0].attn, full.layers[0].attn
    assert attn.attention_flops(b, n) == full_attn.attention_flops(b, n)
