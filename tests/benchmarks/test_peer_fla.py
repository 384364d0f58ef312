r"""Our chunked gated delta rule beside flash-linear-attention's plain chunked reference
(``naive_chunk_gated_delta_rule`` of fla-core 0.6.0, loaded by path without triton:
tests/fla_naive.py), on the same inputs (pytest-benchmark).

The issue's shape: n = 4096 (``ATTNBENCH_MIXER_N``), 12 heads, dk = dv = 64, batch 1, fp32 on
the CPU, under inference_mode; L2-normalised keys, β ∈ (0, 1), log-decays as Gated DeltaNet
makes them at initialisation. Theirs computes in fp32 and inverts each chunk's (I + A) by a
loop over its rows; ours solves all chunks' triangular systems at once. Both at chunk 64.
No speed is asserted: the ratio goes to the notes and docs.

    pytest tests/benchmarks/test_peer_fla.py --benchmark-enable --benchmark-only
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from attnbench.attention.delta_scan import delta_chunked
from tests.fla_naive import naive_chunk_gated_delta_rule

N = int(os.environ.get("ATTNBENCH_MIXER_N", "4096"))
B, H, D = 1, 12, 64


def _inputs() -> tuple[torch.Tensor, ...]:
    """(b, h, n, ·) q (scaled), k (unit), v; beta, g (b, h, n)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=gen) for _ in range(3))
    k = F.normalize(k, dim=-1)
    beta = torch.rand(B, H, N, generator=gen)
    rate = F.softplus(torch.randn(B, H, N, generator=gen) - 4.0)
    g = -torch.empty(H, 1).uniform_(1, 16, generator=gen) * rate
    return q * D**-0.5, k, v, beta, g


@pytest.mark.parametrize("who", ["ours", "fla-naive"])
def test_gated_delta_rule_chunked(benchmark, who: str) -> None:
    q, k, v, beta, g = _inputs()
    benchmark.group = f"gated delta rule, chunk 64, n={N}"
    if who == "ours":

        def run() -> torch.Tensor:
            return delta_chunked(q, k, v, beta, g, chunk=64)[0]
    else:
        fn, why = naive_chunk_gated_delta_rule()
        if fn is None:
            pytest.skip(why)
        theirs = [t.transpose(1, 2).contiguous() for t in (q, k, v, g, beta)]

        def run() -> torch.Tensor:
            return fn(*theirs, chunk_size=64, scale=1.0)[0]

    with torch.inference_mode():
        out = benchmark(run)
    assert torch.isfinite(out).all()
