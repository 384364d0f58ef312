"""A mechanism with a decode form, added by a plugin from its own file
(``tests/toys/toy_decoder.py``), is held to what every built-in decoder is held to.

The file is loaded as ``attnbench`` loads it: named in ``$ATTNBENCH_PLUGINS`` and imported by
the registry's first look (``attnbench.names()``), never imported here; after each test it is
unregistered, so the rest of the suite sees the built-ins only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import attnbench
from attnbench import registry
from attnbench.measure.flops import count_flops
from tests import test_decode_contract as contract
from tests.toys import loaded

NAME, TOY = "toy_mean", "tests.toys.toy_decoder"


@pytest.fixture(autouse=True)
def _toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes, many small ops (as the contract's tests)
    with loaded(monkeypatch, TOY, registry._REGISTRY, NAME):
        yield
    torch.set_num_threads(threads)


def _layer(causal: bool = True) -> torch.nn.Module:
    m = attnbench.create(NAME, d_model=16, n_heads=2, max_seq_len=12, causal=causal)
    return m.eval().double()


def test_it_is_registered_as_a_decoder() -> None:
    assert NAME in attnbench.names()
    info = attnbench.info(NAME)
    assert info.causal and info.cannot_decode is None and info.unavailable is None
    assert NAME in contract.decoders()


def test_each_decode_step_equals_the_causal_forward_at_its_position() -> None:
    """A prompt of 3 tokens, then one token at a time: each output is the forward's at that
    position, which is the mean of the values up to it, in float64."""
    m = _layer()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    with torch.inference_mode():
        want = m(x)
        v = m.v_proj(x)
        means = v.cumsum(1) / torch.arange(1, 13, dtype=torch.float64)[:, None]
        assert torch.allclose(want, m.out_proj(means), atol=1e-12, rtol=0)
        state = m.new_state(2, 12, torch.float64, contract.CPU)
        prompt = m.extend(x[:, :3], state)
        assert (prompt - want[:, :3]).abs().max() < contract.FP64_TOL
        for i in range(3, 12):
            step = m.extend(x[:, i : i + 1], state)
            assert (step[:, 0] - want[:, i]).abs().max() < contract.FP64_TOL, i


def test_the_non_causal_form_is_every_tokens_mean() -> None:
    m = _layer(causal=False)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    mask = torch.tensor([[False, False, False, True, True]])
    with torch.inference_mode():
        out = m(x, mask)  # every position: the mean of the three real tokens' values
        want = m.out_proj(m.v_proj(x[:, :3]).mean(1, keepdim=True)).expand_as(out)
        assert torch.allclose(out, want, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="extend needs a layer built with causal=true"):
        m.extend(x, m.new_state(1, 5, torch.float64, contract.CPU))


def test_it_keeps_the_decode_contract() -> None:
    """The checks every built-in decoder passes (tests/test_decode_contract.py): prefill in
    pieces then steps equal the forward (a layer and a model, fp64 and fp32), left padding
    never reaches a real output, ``state_bytes`` is what ``new_state`` holds, ``step_flops``
    what FlopCounterMode counts."""
    (params,) = contract.variants(NAME)
    assert params == {"causal": True}
    for form in contract.FORMS:
        for dtype, tol in ((torch.float64, contract.FP64_TOL), (torch.float32, contract.FP32_TOL)):
            contract.test_prefill_then_decode_equals_the_causal_forward(
                NAME, params, form, dtype, tol
            )
        contract.test_left_padding_never_reaches_a_real_output(NAME, params, form)
        contract.test_state_bytes_are_what_the_state_holds(NAME, params, form)
        contract.test_step_flops_agree_with_flop_counter(NAME, params, form)


def test_its_forward_flops_are_what_the_counter_counts() -> None:
    m = _layer().float()
    for b, n in ((1, 1), (3, 7)):
        x = torch.randn(b, n, 16)
        with torch.inference_mode():
            assert m.flops(b, n) == count_flops(m, x), (b, n)
