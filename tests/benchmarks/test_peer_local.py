r"""local beside the public ``local-attention`` package, and beside its own matmul floor.

The shape of tests/benchmarks/test_forward_speed.py (n = 4096, d_model 768, 12 heads, batch 1,
fp32, CPU), window w = 256, timed by the same ``_run``. Three rows:

* ``ours``: attnbench's ``local`` layer, non-causal, each query sees |i − j| ≤ w/2.
* ``peer``: ``local_attention.LocalAttention(window_size=w/2, look_backward=1,
  look_forward=1, exact_windowsize=True)`` between *our* layer's four projections, so both do
  the same layer's work. Its blocks are w/2 wide, ours too, so both multiply the same 3·w/2
  keys per query; with ``exact_windowsize`` it masks to the same band, and the benchmark
  checks both outputs agree before timing. (Without it, its default, a query sees the whole
  of its own and both neighbouring blocks: 2 to 3 block widths, not a band; its padding and
  out-of-range keys get −finfo.max, not −inf, so a query with no real key averages the
  values instead of giving 0. tests/test_local.py holds both facts.)
* ``floor``: the **matmul floor** of ``local``: the same matmuls and nothing else, timed in the
  same run: the four d × d projections (the layer's own ``nn.Linear``s) and the blocked
  QKᵀ and P·V as two ``torch.bmm`` at the shapes the layer multiplies, (nb·h, B, dh) @
  (nb·h, dh, 3B) and (nb·h, B, 3B) @ (nb·h, 3B, dh) with B = w/2 and nb = n/B, on operands
  made beforehand. No masking, softmax, padding or copies; its FLOP count equals the layer's
  (checked). ``ours / floor`` is what the rest of the layer costs on top.

The targets, read from the medians (never asserted: speed is for benchmarks only): peer / ours
≥ 1.0 and ours / floor ≤ 1.5.

    pytest tests/benchmarks/test_peer_local.py --benchmark-enable --benchmark-only \
        --benchmark-json local.json
    python -m tests.benchmarks.test_peer_local local.json    # the two ratios
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

import attnbench
from attnbench.attention.local import layout
from attnbench.measure.flops import count_flops
from tests.benchmarks.test_forward_speed import B, D, H, K, _run, _x, n_of

WINDOW = K  # 256: the budget every mechanism gets in test_forward_speed.py


def _ours(n: int) -> nn.Module:
    torch.manual_seed(0)
    return attnbench.create("local", d_model=D, n_heads=H, max_seq_len=n, window=WINDOW).eval()


class PeerLayer(nn.Module):
    """local_attention.LocalAttention with our layer's projections around it."""

    def __init__(self, ours: nn.Module) -> None:
        super().__init__()
        from local_attention import LocalAttention

        self.ours = ours
        self.inner = LocalAttention(
            window_size=WINDOW // 2, look_backward=1, look_forward=1, exact_windowsize=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.ours.qkv_heads(x)  # (b, h, n, dh); the peer folds b and h
        return self.ours.out_proj(self.ours.merge_heads(self.inner(q, k, v)))


def test_ours(benchmark) -> None:
    _run(benchmark, _ours(n_of(benchmark)), role="ours")


def test_peer_local_attention(benchmark) -> None:
    pytest.importorskip("local_attention")
    n = n_of(benchmark)
    ours = _ours(n)
    peer = PeerLayer(ours).eval()
    with torch.inference_mode():
        x = _x(n)
        torch.testing.assert_close(peer(x), ours(x), atol=1e-5, rtol=1e-4)  # the same band
    _run(benchmark, peer, role="peer")


def test_matmul_floor(benchmark) -> None:
    n = n_of(benchmark)
    ours = _ours(n)
    block, blocks, back, forward = layout(WINDOW, False, n)
    width, heads = (1 + back + forward) * block, blocks * H
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B * heads, block, D // H, generator=g)
    k_t = torch.randn(B * heads, D // H, width, generator=g)
    p = torch.randn(B * heads, block, width, generator=g)
    v = torch.randn(B * heads, width, D // H, generator=g)
    projections = (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj)

    def floor(x: torch.Tensor) -> torch.Tensor:
        for proj in projections:
            proj(x)
        torch.bmm(q, k_t)
        return torch.bmm(p, v)

    with torch.inference_mode():
        assert count_flops(floor, _x(n)) == ours.flops(B, n)  # the same matmuls, all of them
    _run(benchmark, floor, role="floor")


def ratios(data: dict) -> str:
    """peer / ours and ours / floor from a pytest-benchmark JSON of this file."""
    med = {b["extra_info"]["role"]: b["stats"]["median"] for b in data["benchmarks"]}
    return (
        f"ours {med['ours'] * 1e3:.0f} ms, peer {med['peer'] * 1e3:.0f} ms, floor "
        f"{med['floor'] * 1e3:.0f} ms: peer / ours {med['peer'] / med['ours']:.2f}, "
        f"ours / floor {med['ours'] / med['floor']:.2f}"
    )


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(ratios(json.load(f)))
