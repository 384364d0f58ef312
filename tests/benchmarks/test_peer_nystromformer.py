r"""nystromformer beside the public ``nystrom-attention`` package.

The shape of tests/benchmarks/test_forward_speed.py (n = 4096, d_model 768, 12 heads, batch 1,
fp32, CPU), 256 landmarks (the budget every mechanism gets there), 6 pseudo-inverse iterations
and a 33-tap convolution of V on both sides, timed by the same ``_run``:

* ``ours``: attnbench's ``nystromformer`` layer.
* ``peer``: ``nystrom_attention.NystromAttention``, the whole layer (its fused bias-free QKV
  projection, its output projection, its residual convolution). It does the same matmuls
  but one: it multiplies (F A⁺) (B V), an n × m by m × m product per head (2·n·m²·h, 6.4
  GFLOP here) that our order F (A⁺ (B V)) never makes, and it materialises the three softmax
  matrices that our fused sdpa calls do not. Its Z₀ is scaled over every head at once, so
  the two outputs differ after 6 steps (tests/test_nystromformer.py holds where they agree).

The target, read from the medians (never asserted: speed is for benchmarks only):
peer / ours ≥ 1.0.

    pytest tests/benchmarks/test_peer_nystromformer.py --benchmark-enable --benchmark-only \
        --benchmark-json nystrom.json
    python -m tests.benchmarks.test_peer_nystromformer nystrom.json    # the ratio
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

import attnbench
from tests.benchmarks.test_forward_speed import D, H, K, _run, n_of

LANDMARKS, ITERATIONS, CONV = K, 6, 33


def test_ours(benchmark) -> None:
    torch.manual_seed(0)
    m = attnbench.create(
        "nystromformer", d_model=D, n_heads=H, max_seq_len=n_of(benchmark), num_landmarks=LANDMARKS,
        pinv_iterations=ITERATIONS, conv_kernel=CONV,
    ).eval()  # fmt: skip
    _run(benchmark, m, role="ours")


def test_peer_nystrom_attention(benchmark) -> None:
    nystrom_attention = pytest.importorskip("nystrom_attention")
    torch.manual_seed(0)
    m = nystrom_attention.NystromAttention(
        dim=D, dim_head=D // H, heads=H, num_landmarks=LANDMARKS,
        pinv_iterations=ITERATIONS, residual_conv_kernel=CONV,
    ).eval()  # fmt: skip
    _run(benchmark, m, role="peer")


def _ratio(path: str) -> None:
    """peer / ours from a --benchmark-json file: above 1.0, ours is faster."""
    rows = json.loads(open(path).read())["benchmarks"]
    median = {r["extra_info"]["role"]: r["stats"]["median"] for r in rows}
    print(f"ours {median['ours'] * 1e3:.0f} ms, peer {median['peer'] * 1e3:.0f} ms, "
          f"peer / ours {median['peer'] / median['ours']:.2f}")  # fmt: skip


if __name__ == "__main__":
    _ratio(sys.argv[1])
