"""FLOP counting sees every kernel a CPU forward runs, the fused CPU flash attention included."""

from __future__ import annotations

import pytest
import torch

import attnbench
from attnbench.measure.flops import count_flops


def test_sdpa_counts_like_vanilla_on_cpu() -> None:
    """Same math, so the same FLOPs: the CPU flash kernel must not count as zero."""
    x = torch.randn(2, 64, 32)
    counts = {
        name: count_flops(attnbench.create(name, d_model=32, n_heads=4, max_seq_len=64), x)
        for name in ("vanilla", "sdpa")
    }
    b, n, d = x.shape
    projections = 4 * 2 * b * n * d * d
    attention = 2 * 2 * b * n * n * d  # QKᵀ and PV
    assert counts["vanilla"] == counts["sdpa"] == projections + attention


def test_linformer_shared_projection_flops() -> None:
    """kv sharing: E X once (2knd), K and V on k rows (2·2kd²), attention 4nkd, Q and O 2·2nd²."""
    b, n, d, k = 1, 64, 32, 16
    m = attnbench.create("linformer", d_model=d, n_heads=4, max_seq_len=n, k=k, sharing="kv")
    want = b * (2 * k * n * d + 2 * 2 * k * d * d + 4 * n * k * d + 2 * 2 * n * d * d)
    # + the E·1 row sums (2kn): the bias term of the reordered projection
    assert count_flops(m, torch.randn(b, n, d)) == want + b * 2 * k * n


def _variants() -> list[tuple[str, dict]]:
    from attnbench.attention.linformer import PROJECTIONS, SHARING

    out = [
        ("vanilla", {}),
        ("sdpa", {}),
        ("sdpa", {"causal": True}),
        ("performer", {"nb_features": 16}),
        ("performer", {"nb_features": 16, "causal": True}),
        ("performer", {"nb_features": 24, "kernel": "relu"}),
        ("nystromformer", {"num_landmarks": 8}),
        ("linear", {}),
        ("linear", {"causal": True}),
        ("local", {"window": 16}),
        ("local", {"window": 16, "causal": True}),
        ("reformer", {"bucket_size": 8, "n_hashes": 2}),
        ("retnet", {"chunk": 16}),
        ("gla", {"chunk": 16}),
        ("gla", {"chunk": 12}),  # sub-blocks of 8 padded to 16, the last chunk short
        ("mamba2", {"chunk": 16, "d_state": 8, "groups": 2}),
        ("deltanet", {"chunk": 16}),
        ("gated_deltanet", {"chunk": 24}),
        ("gated_deltanet", {"chunk": 24, "v_heads": 8}),  # value heads apart from the 4 key heads
        ("deltanet", {"chunk": 16, "v_heads": 8}),
    ]
    out += [
        ("linformer", {"k": 8, "sharing": s, "projection": p}) for s in SHARING for p in PROJECTIONS
    ]
    return out


@pytest.mark.parametrize(("name", "params"), _variants(), ids=str)
@pytest.mark.parametrize("n", [64, 40])
def test_analytic_flops_agree_with_flop_counter(name: str, params: dict, n: int) -> None:
    b, d = 3, 32
    model = attnbench.build_model(
        name, layers=2, d_model=d, n_heads=4, d_ff=48, max_seq_len=64, **params
    )
    # every path is matmuls the counter sees: causal Performer's chunked prefix sums too
    assert model.flops(b, n) == count_flops(model, torch.randn(b, n, d))
