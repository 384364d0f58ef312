r"""Forward speed of our reformer beside reformer-pytorch's own ``LSHSelfAttention``.

The shape of test_forward_speed.py (n = 4096, d_model 768, 12 heads, batch 1, fp32, CPU) at
the same budget on both sides: bucket_size 64 (the library's default and the paper's) and
256 (the ``k`` that test_forward_speed.py gives every mechanism), 8 rounds of hashing. The
library's layer has no biases on its q/k and v projections and draws its rotations on every
forward; the work is otherwise the same (same FLOPs, recorded beside each timing). No speed
is asserted here: figures go to docs/speed.md.

    pytest tests/benchmarks/test_peer_reformer.py --benchmark-enable --benchmark-only
"""

from __future__ import annotations

import pytest
import torch

import attnbench
from tests.benchmarks.test_forward_speed import D, H, _run, n_of

N_HASHES = 8


@pytest.mark.parametrize("bucket_size", [64, 256])
def test_attnbench_reformer(benchmark, bucket_size: int) -> None:
    torch.manual_seed(0)
    m = attnbench.create(
        "reformer", d_model=D, n_heads=H, max_seq_len=n_of(benchmark), bucket_size=bucket_size,
        n_hashes=N_HASHES,
    ).eval()  # fmt: skip
    _run(benchmark, m, role="ours")


@pytest.mark.parametrize("bucket_size", [64, 256])
def test_peer_reformer_pytorch(benchmark, bucket_size: int) -> None:
    from reformer_pytorch import LSHSelfAttention

    torch.manual_seed(0)
    m = LSHSelfAttention(D, heads=H, bucket_size=bucket_size, n_hashes=N_HASHES).eval()
    _run(benchmark, m, role="peer")
