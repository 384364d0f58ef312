"""Packed rows, held over the registry as the contract tests are: every document's output in a
packed row equals that document run alone, in float64 to rounding, forward and training
gradients, causal and not, for every mechanism that packs; one that cannot refuses in one line
with its reason. A new mechanism is held to this without editing the test.

The rows mix a one-token document, documents shorter and longer than a chunk (the mixers'
chunk is set to 8 here so that documents start inside chunks and span several), and a row of
one document.
"""

from __future__ import annotations

import pytest
import torch

import attnbench
from attnbench.attention.packing import Packing
from attnbench.measure.flops import count_flops
from tests.conftest import own_defaults, runnable_here

D, H, T = 32, 4, 40
ROWS = ((5, 13, 1, 21), (40,), (7, 9, 24))
COPIES = ((5, 13, 1, 21),) * 2  # rows of the same documents: each document run once for both
SMALL_CHUNKS = {"chunk": 8, "chunk_size": 8}  # whichever a mechanism has
# flex's compiled CPU kernel has no float64: it is held in fp32, to fp32's rounding
FP32_ONLY = {"flex"}


def _dtype(name: str) -> torch.dtype:
    return torch.float32 if name in FP32_ONLY else torch.float64


def _create(name: str, causal: bool, device: str = "cpu") -> torch.nn.Module:
    info = attnbench.info(name)
    params: dict[str, object] = dict(own_defaults(name))
    if causal:
        params["causal"] = True
    if info.budget:
        params[info.budget] = 8
    params.update({k: v for k, v in SMALL_CHUNKS.items() if k in info.params})
    torch.manual_seed(0)
    with torch.device(device):
        m = attnbench.create(name, d_model=D, n_heads=H, max_seq_len=T, **params)
    return m.to(_dtype(name))


def _modes(name: str) -> list[bool]:
    info = attnbench.info(name)
    if info.causal_only:
        return [True]
    return [False, True] if info.causal else [False]


PACKS = [
    (name, causal)
    for name in runnable_here()
    if attnbench.info(name).cannot_pack is None
    for causal in _modes(name)
]


def _alone(m: torch.nn.Module, x: torch.Tensor, packing: Packing) -> torch.Tensor:
    """Each document through the layer by itself, laid back where it was in the row."""
    rows = []
    for r, bounds in enumerate(packing.bounds()):
        rows.append(torch.cat([m(x[r : r + 1, s:e]) for s, e in bounds], dim=1))
    return torch.cat(rows)


@pytest.mark.parametrize("rows", [ROWS, COPIES], ids=["rows", "copies"])
@pytest.mark.parametrize(("name", "causal"), PACKS)
def test_each_packed_document_is_the_document_alone(
    name: str, causal: bool, rows: tuple[tuple[int, ...], ...]
) -> None:
    m = _create(name, causal)
    packing = Packing.of(rows)
    dtype = _dtype(name)
    trains = attnbench.info(name).no_cpu_backward is None  # flex: forward only on a CPU
    x = torch.randn(len(rows), T, D, dtype=dtype, requires_grad=trains)
    weight = torch.randn(len(rows), T, D, dtype=dtype)  # a loss that reads every output
    inputs = [x, *m.parameters()]

    def grads(out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad((out * weight).sum(), inputs) if trains else ()

    with torch.set_grad_enabled(trains):
        torch.manual_seed(1)  # a mechanism that draws (random features) draws alike in both
        packed = m(x, packing=packing)
        packed_grads = grads(packed)
        torch.manual_seed(1)
        alone = _alone(m, x, packing)
        alone_grads = grads(alone)

    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(packed, alone, atol=tol, rtol=tol)
    for got, want in zip(packed_grads, alone_grads, strict=True):
        torch.testing.assert_close(got, want, atol=10 * tol, rtol=10 * tol)


@pytest.mark.parametrize(
    "name", [n for n in runnable_here() if attnbench.info(n).cannot_pack is not None]
)
def test_a_mechanism_that_cannot_pack_says_why(name: str) -> None:
    m = _create(name, causal=False)
    x = torch.randn(len(ROWS), T, D, dtype=torch.float64)
    with pytest.raises(ValueError, match=f"packing: {name} cannot pack: ") as e:
        m(x, packing=Packing.of(ROWS))
    assert "\n" not in str(e.value)


def test_packing_checks_its_rows_and_the_input() -> None:
    with pytest.raises(ValueError, match="packing: every row must hold the same tokens"):
        Packing.of([(3, 4), (5,)])
    with pytest.raises(ValueError, match=r"packing\[0\]\[1\]: must be an integer >= 1"):
        Packing.of([(3, 0)])
    with pytest.raises(ValueError, match="packing: must be rows of at least one document"):
        Packing.of([])
    m = _create("vanilla", causal=False)
    x = torch.randn(1, T, D, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"packing: needs x of \(batch, T\) = \(3, 40\)"):
        m(x, packing=Packing.of(ROWS))
    mask = torch.zeros(3, T, dtype=torch.bool)
    with pytest.raises(ValueError, match="no key_padding_mask"):
        m(x.expand(3, -1, -1), mask, Packing.of(ROWS))


@pytest.mark.parametrize(
    ("name", "causal"), [(n, c) for n, c in PACKS if not attnbench.info(n).compiles]
)
def test_packed_backward_flops_are_what_flop_counter_mode_counts(name: str, causal: bool) -> None:
    """``packed_flops_backward`` against FlopCounterMode's count of the backward of the same
    packed forward (flex aside: its CPU kernel has no backward). Each document alone's
    backward where the mechanism packs document by document; one pass over the row where it
    packs so (the chunked recurrences skip the same first and last chunk's work as
    unpacked, once per row); documents of two tokens or more, as for the forward."""
    m = _create(name, causal)
    rows = ((5, 13, 2, 20), (40,), (7, 9, 24))
    x = torch.randn(len(rows), T, D, dtype=_dtype(name), requires_grad=True)
    packing = Packing.of(rows)
    loss = m(x, packing=packing).sum()
    assert count_flops(loss.backward) == m.packed_flops_backward(packing)


def test_packing_tensors_by_hand() -> None:
    p = Packing.of([(2, 3), (1, 4)])
    assert p.width == 5 and p.batch == 2 and p.lengths == (2, 3, 1, 4)
    assert p.bounds() == [[(0, 2), (2, 5)], [(0, 1), (1, 5)]]
    assert p.offsets("cpu").tolist() == [[0, 1, 0, 1, 2], [0, 0, 1, 2, 3]]
    starts = [[True, False, True, False, False], [True, True, False, False, False]]
    assert p.starts("cpu").tolist() == starts


@pytest.mark.parametrize(("name", "causal"), PACKS)
def test_packed_flops_are_what_flop_counter_mode_counts(name: str, causal: bool) -> None:
    """The formula a packed row's FLOPs come from (``packed_flops``: one pass over the row or
    each document alone, as the mechanism packs) against FlopCounterMode's count of the same
    forward, on this CPU at a toy size (Performer's causal features keep a constant on the
    CPU, so meta cannot trace them; flex's compiled kernel is counted on meta). Every
    document here has two tokens or more: at one token Performer's feature einsum is no
    matmul to FlopCounterMode (its n = 1 count is 512 under ``flops(1, 1)``'s, a matmul FLOP
    count's blind spot, not the formula's)."""
    # a compiled kernel (flex) runs under a FLOP counter on meta tensors only
    device = "meta" if attnbench.info(name).compiles else "cpu"
    m = _create(name, causal, device)
    rows = ((5, 13, 2, 20), (40,), (7, 9, 24))
    x = torch.randn(len(rows), T, D, dtype=_dtype(name), device=device)
    packing = Packing.of(rows)
    with torch.no_grad():
        assert count_flops(m, x, packing=packing) == m.packed_flops(packing)
