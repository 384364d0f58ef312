"""The contract every registered mechanism keeps, checked the same way for each one.

Padded keys contribute nothing: the output at real positions equals that of the sequence cut
short to its real length, and whatever finite values sit at padded positions cannot reach a
real output (non-finite ones are the mechanisms' own tests: the exact ones multiply a padded
NaN value by its zero weight, as fairseq and PyTorch do). Under ``causal=True`` no output
sees a later position. Bad parameters are one ``ValueError`` line naming the parameter. A
mechanism that cannot keep a part of this says which in ``info().limits``, and that part is
skipped for it with that reason.
"""

from __future__ import annotations

import pytest
import torch

import attnbench
from tests.conftest import runnable_here

D, H, N, REAL = 32, 4, 32, 24


def _create(name: str, **params: object) -> torch.nn.Module:
    budget = attnbench.info(name).budget
    if budget and budget not in params:
        params[budget] = 8
    return attnbench.create(name, d_model=D, n_heads=H, max_seq_len=N, **params).eval()


def _causal_modes(name: str) -> list[bool]:
    return [False, True] if attnbench.info(name).causal else [False]


CASES = [
    (name, causal)
    for name in runnable_here()
    if attnbench.info(name).padding_mask
    for causal in _causal_modes(name)
]


@pytest.mark.parametrize(("name", "causal"), CASES)
def test_padding_is_the_sequence_cut_short(name: str, causal: bool) -> None:
    if why := attnbench.info(name).limits:
        pytest.skip(f"{name}: {why}")
    m = _create(name, causal=causal) if causal else _create(name)
    x = torch.randn(2, N, D)
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[0, REAL:] = True
    with torch.inference_mode():
        padded = m(x, mask)
        short = m(x[:1, :REAL])
        whole = m(x[1:])
    torch.testing.assert_close(padded[0, :REAL], short[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(padded[1], whole[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("name", "causal"), CASES)
def test_nothing_at_padded_positions_reaches_a_real_output(name: str, causal: bool) -> None:
    m = _create(name, causal=causal) if causal else _create(name)
    x = torch.randn(2, N, D)
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[0, REAL:] = True
    mask[1, 3::5] = True  # scattered padding too
    y = x.clone()
    y[mask] = 1e4 * torch.randn_like(y[mask])
    with torch.inference_mode():
        torch.manual_seed(1)
        want = m(x, mask)
        torch.manual_seed(1)  # a mechanism that draws (LSH rotations) draws the same
        got = m(y, mask)
    torch.testing.assert_close(got[~mask], want[~mask], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", [n for n in runnable_here() if attnbench.info(n).causal])
def test_causal_outputs_never_see_a_later_position(name: str) -> None:
    m = _create(name, causal=True)
    x = torch.randn(2, N, D)
    y = x.clone()
    t = 13
    y[:, t + 1 :] = 10 * torch.randn_like(y[:, t + 1 :])
    with torch.inference_mode():
        torch.manual_seed(1)
        want = m(x)
        torch.manual_seed(1)
        got = m(y)
    torch.testing.assert_close(got[:, : t + 1], want[:, : t + 1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", [n for n in runnable_here() if not attnbench.info(n).causal])
def test_causal_is_refused_with_a_reason(name: str) -> None:
    """With a ``causal`` setting that refuses true, or without one (docs/mechanisms.md's example):
    either way one line naming it."""
    with pytest.raises(ValueError, match="causal") as e:
        _create(name, causal=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", runnable_here())
def test_bad_parameters_are_one_line_naming_the_parameter(name: str) -> None:
    with pytest.raises(ValueError, match="no_such_param") as e:
        _create(name, no_such_param=1)
    assert "\n" not in str(e.value)
    budget = attnbench.info(name).budget
    if budget:
        for bad in (0, -3, "many"):
            with pytest.raises(ValueError, match=budget) as e:
                _create(name, **{budget: bad})
            assert "\n" not in str(e.value)
