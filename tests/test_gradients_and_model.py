"""Every mechanism trains (gradients reach every learnable parameter) and stacks."""

from __future__ import annotations

import itertools

import pytest
import torch

import attnbench
from attnbench.attention.linformer import PROJECTIONS, SHARING
from tests.conftest import runnable_here

D, H, N = 32, 4, 32


def _cases() -> list[tuple[str, dict]]:
    cases = [(name, {}) for name in runnable_here() if name != "linformer"]
    cases += [
        ("linformer", {"k": 8, "sharing": s, "projection": p})
        for s, p in itertools.product(SHARING, PROJECTIONS)
    ]
    return cases


@pytest.mark.parametrize(("name", "params"), _cases(), ids=str)
def test_gradients_reach_every_learnable_parameter(name: str, params: dict) -> None:
    if why := attnbench.info(name).no_cpu_backward:
        pytest.skip(f"{name}: {why}")  # it trains on CUDA only
    model = attnbench.build_model(
        name, layers=2, d_model=D, n_heads=H, d_ff=64, max_seq_len=N, **params
    ).train()
    x = torch.randn(2, N, D, requires_grad=True)
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[1, 20:] = True
    model(x, mask).square().mean().backward()
    missing = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)
    ]
    assert not missing, f"no gradient reached {missing}"
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", runnable_here())
def test_encoder_shape_and_mode(name: str) -> None:
    budget = attnbench.info(name).budget
    params = {budget: 8} if budget else {}
    model = attnbench.build_model(
        name, layers=3, d_model=D, n_heads=H, d_ff=64, max_seq_len=N, **params
    )
    assert not model.training and len(model.layers) == 3
    with torch.inference_mode():
        y = model(torch.randn(2, N, D))
    assert y.shape == (2, N, D) and torch.isfinite(y).all()


def test_default_model_is_roberta_base_shaped() -> None:
    model = attnbench.build_model("vanilla", max_seq_len=512)
    layer = model.layers[0]
    assert len(model.layers) == 12
    assert (layer.attn.d_model, layer.attn.n_heads, layer.fc1.out_features) == (768, 12, 3072)
    # 12 × (4·768² + 4·768 attention + 2·768·3072 + 3072 + 768 FFN + 2·2·768 norms) = 85.0M
    assert sum(p.numel() for p in model.parameters()) == 12 * (
        4 * 768 * 768 + 4 * 768 + 2 * 768 * 3072 + 3072 + 768 + 4 * 768
    )


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"layers": 0}, "layers: must be an integer >= 1"),
        ({"d_ff": -5}, "d_ff: must be an integer >= 1"),
        ({"sharing": "all"}, "sharing: must be one of"),
    ],
)
def test_build_model_errors(params: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        attnbench.build_model("linformer", max_seq_len=64, d_model=D, n_heads=H, k=8, **params)
