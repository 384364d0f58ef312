"""vanilla and sdpa against an independent float64 reference of multi-head attention."""

from __future__ import annotations

import pytest
import torch

import attnbench
from tests.reference import reference_mha

CASES = [("vanilla", {}), ("sdpa", {"backend": "math"}), ("sdpa", {"backend": "auto"})]


def _mask(b: int, n: int) -> torch.Tensor:
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[0, -3:] = True  # right padding
    mask[1, 1::4] = True  # scattered padding (position 0 real, so causal rows are never empty)
    return mask


@pytest.mark.parametrize(("name", "params"), CASES)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_reference(name: str, params: dict, padded: bool, causal: bool) -> None:
    m = attnbench.create(name, d_model=32, n_heads=4, max_seq_len=64, causal=causal, **params)
    m.eval()
    x = torch.randn(2, 12, 32)
    mask = _mask(2, 12) if padded else None
    got = m(x, mask)
    want = reference_mha(m, x, mask, causal=causal)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("name", "params"), CASES)
def test_padding_values_do_not_leak(name: str, params: dict) -> None:
    m = attnbench.create(name, d_model=32, n_heads=4, max_seq_len=64, **params).eval()
    x, mask = torch.randn(2, 12, 32), _mask(2, 12)
    y = x.clone()
    y[mask] = 100 * torch.randn_like(y[mask])
    torch.testing.assert_close(m(x, mask)[~mask], m(y, mask)[~mask])


def test_sdpa_backend_that_cannot_run_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("on CUDA the efficient backend can run")
    m = attnbench.create("sdpa", d_model=32, n_heads=4, max_seq_len=64, backend="efficient")
    with pytest.raises(RuntimeError, match="sdpa: backend=efficient cannot run"):
        m(torch.randn(1, 8, 32))
