"""What every mechanism must survive: meta tensors (the memory model), half precision on the
CPU, leading padding under causal masks, and non-finite values at padded positions."""

from __future__ import annotations

import itertools

import pytest
import torch

import attnbench
from attnbench.attention.linformer import PROJECTIONS, SHARING
from tests.conftest import runnable_here

D, H, N = 32, 4, 32


def _params(name: str) -> dict:
    budget = attnbench.info(name).budget
    return {budget: 8} if budget else {}


@pytest.mark.parametrize("name", runnable_here())
def test_builds_and_runs_on_meta(name: str) -> None:
    """The memory model runs the forward on meta tensors: building under the meta device too."""
    with torch.device("meta"):
        model = attnbench.build_model(
            name, layers=2, d_model=D, n_heads=H, d_ff=48, max_seq_len=N, **_params(name)
        )
    model = model.to("meta")  # a buffer a library insists on drawing on the CPU follows
    x = torch.empty(3, N, D, device="meta", dtype=torch.float16)
    with torch.inference_mode():
        y = model.half()(x, torch.zeros(3, N, dtype=torch.bool, device="meta"))
    assert y.shape == (3, N, D) and y.device.type == "meta"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", runnable_here())
def test_half_precision_on_cpu_is_finite_and_close(name: str, dtype: torch.dtype) -> None:
    if "fp16" not in attnbench.info(name).dtypes:
        pytest.skip(f"{name} does not claim half precision")
    model = attnbench.build_model(
        name, layers=2, d_model=D, n_heads=H, d_ff=48, max_seq_len=N, **_params(name)
    )
    x = torch.randn(2, N, D)
    with torch.inference_mode():
        want = model(x)
        got = model.to(dtype)(x.to(dtype)).float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("name", [n for n in runnable_here() if attnbench.info(n).causal])
def test_causal_with_leading_padding_keeps_real_rows_finite(name: str) -> None:
    """A padded query that sees no key must not turn NaN and spread to real tokens."""
    model = attnbench.build_model(
        name, layers=2, d_model=D, n_heads=H, d_ff=48, max_seq_len=N, causal=True, **_params(name)
    )
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[0, :3] = True  # left padding: queries 0..2 see no real key
    with torch.inference_mode():
        y = model(torch.randn(2, N, D), mask)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize(("sharing", "projection"), itertools.product(SHARING, PROJECTIONS))
def test_linformer_non_finite_padding_does_not_leak(sharing: str, projection: str) -> None:
    layer = attnbench.create(
        "linformer",
        d_model=D,
        n_heads=H,
        max_seq_len=N,
        k=8,
        sharing=sharing,
        projection=projection,
    ).eval()
    x = torch.randn(2, N, D)
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[:, 20:] = True
    bad = x.clone()
    bad[0, 20:], bad[1, 25:] = float("inf"), float("nan")
    with torch.inference_mode():
        torch.testing.assert_close(layer(bad, mask)[~mask], layer(x, mask)[~mask])


def test_performer_non_finite_padding_does_not_leak() -> None:
    layer = attnbench.create("performer", d_model=D, n_heads=H, max_seq_len=N, nb_features=16)
    x = torch.randn(2, N, D)
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[:, 20:] = True
    bad = x.clone()
    bad[:, 20:] = float("nan")
    with torch.inference_mode():
        torch.testing.assert_close(layer(bad, mask)[~mask], layer(x, mask)[~mask])
