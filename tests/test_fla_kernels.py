"""``kernel=fla`` against ``kernel=torch``: flash-linear-attention's real Triton kernels,
run on this CPU by Triton's interpreter (the bridge: tests/fla_interpret.py), beside our
chunked cores, on the same weights and inputs, through the whole layer.

For each of the five mixers: a left-padded forward and its backward, fp16 and bf16 forwards,
a forward under autocast (a mixed-precision training step's: fp32 weights, their kernel fed
the autocast dtype), a prefill then decode steps, and a packed batch in one call with
``cu_seqlens``; in each, which of their ops ran and the width the core returns (ours and
theirs alike). DeltaNet's fp32 checks run in fp16: ``chunk_delta_rule`` refuses fp32, as
validation does (:func:`test_what_their_ops_refuse_is_refused_at_validation`).

Tolerances are relative to the largest output (or gradient, four times the output's) of ours:
fp32 1e-5 (seen: outputs within 2e-6, gradients within 1.5e-5), fp16 5e-3 (seen: 1e-3,
DeltaNet's gradients 2.4e-3) and bf16 2e-2 (seen: 9e-3): their rounding of q, k, v and of
each chunk's products, where ours accumulate in fp32. Shapes are tiny (d_model 32, 2 heads,
n = 80: two chunks of 64, the second partial), as the interpreter runs each program of the
grid in Python. Skipped where triton 3.9.0 or fla-core 0.6.0 is missing, except in CI
(``ATTNBENCH_REQUIRE_TRITON=1``), which installs both (the extra ``fla-interpret``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator

import pytest
import torch

import attnbench
from attnbench.attention import fla_kernels
from attnbench.attention.mixer import RecurrentMixer
from attnbench.attention.packing import Packing
from attnbench.cell import Cell
from attnbench.plan import validate
from tests import fla_interpret

MIXERS = ("retnet", "gla", "mamba2", "deltanet", "gated_deltanet")
D, H, N = 32, 2, 80
OPS = {  # mechanism -> (the chunked op, the decode step's op)
    name: (f"chunk_{package}", f"fused_recurrent_{package}")
    for name, package in fla_kernels.OPS.items()
}
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}
SETTINGS = {"mamba2": {"d_state": 16, "groups": 1}}


def _pair(name: str, dtype: torch.dtype) -> tuple[RecurrentMixer, RecurrentMixer]:
    """Ours and theirs, one set of weights, in ``dtype``."""
    torch.manual_seed(0)
    layers = [
        attnbench.create(
            name, d_model=D, n_heads=H, max_seq_len=N, kernel=kernel, **SETTINGS.get(name, {})
        )
        for kernel in ("torch", "fla")
    ]
    layers[1].load_state_dict(layers[0].state_dict())
    return tuple(m.to(dtype) for m in layers)  # type: ignore[return-value]


def _dtype(name: str, dtype: torch.dtype = torch.float32) -> torch.dtype:
    """fp32, but fp16 for DeltaNet, whose chunked op refuses fp32."""
    return torch.float16 if name == "deltanet" and dtype == torch.float32 else dtype


class _Cores:
    """The dtype each core call of a layer returns (the width the norm after it sees)."""

    def __init__(self, layer: RecurrentMixer) -> None:
        self.dtypes: list[torch.dtype] = []
        for method in ("gated", "delta"):
            bound = getattr(layer, method)
            setattr(layer, method, self._recording(bound))

    def _recording(self, core: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(*args: object, **kwargs: object) -> torch.Tensor:
            o = core(*args, **kwargs)
            self.dtypes.append(o.dtype)
            return o

        return run


def _close(ours: torch.Tensor, theirs: torch.Tensor, tolerance: float) -> float:
    """The largest difference relative to the largest of ours; asserted within tolerance."""
    scale = ours.float().abs().max().item()
    residual = (ours.float() - theirs.float()).abs().max().item() / scale
    assert residual <= tolerance, (residual, tolerance)
    return residual


def _each(name: str, dtype: torch.dtype) -> Iterator[tuple[RecurrentMixer, _Cores]]:
    for layer in _pair(name, dtype):
        yield layer, _Cores(layer)


@pytest.mark.parametrize("name", MIXERS)
def test_a_padded_forward_and_its_backward(name: str, calls: list[str]) -> None:
    dtype = _dtype(name)
    torch.manual_seed(1)
    x = torch.randn(1, N, D, dtype=dtype)
    mask = torch.zeros(1, N, dtype=torch.bool)
    mask[0, :7] = True  # left padding, as attnbench pads prompts
    w = torch.randn(1, N, D, dtype=dtype)
    outs, grads, widths = [], [], []
    for layer, cores in _each(name, dtype):
        xi = x.clone().requires_grad_()
        o = layer(xi, mask)
        (o * w).masked_fill(mask[..., None], 0).sum().backward()
        outs.append(o[~mask])
        grads.append([xi.grad, *(p.grad for p in layer.parameters())])
        widths.append(cores.dtypes)
    tolerance = TOLERANCE[dtype]
    _close(*outs, tolerance)
    for ours, theirs in zip(*grads, strict=True):
        _close(ours, theirs, 4 * tolerance)
    assert widths[0] == widths[1]  # the norm after the core sees one width from both
    assert calls == [OPS[name][0]]  # the forward; the backward is the same op's


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", MIXERS)
def test_half_precision(name: str, dtype: torch.dtype, calls: list[str]) -> None:
    torch.manual_seed(1)
    x = torch.randn(1, N, D, dtype=dtype)
    (ours, a), (theirs, b) = _each(name, dtype)
    _close(ours(x), theirs(x), TOLERANCE[dtype])
    assert a.dtypes == b.dtypes == [torch.float32]  # their fp16 output widened as ours is


@pytest.mark.parametrize("name", MIXERS)
def test_autocast_feeds_their_kernel_the_autocast_dtype(name: str, calls: list[str]) -> None:
    """A mixed-precision training step's forward: fp32 weights under autocast (here the
    CPU's, bf16, as CUDA's is fp16 or bf16): their kernel takes bf16 q, k, v, as the matmuls
    of a GPU step would, not the fp32 of the weights (DeltaNet runs this way in training)."""
    fed: list[torch.dtype] = []
    op = fla_kernels._op

    def spying(package: str, fn: str) -> Callable[..., object]:
        real = op(package, fn)

        def run(q: torch.Tensor, *args: object, **kwargs: object) -> object:
            fed.append(q.dtype)
            return real(q, *args, **kwargs)

        return run

    torch.manual_seed(1)
    x = torch.randn(1, N, D)
    (ours, a), (theirs, b) = _each(name, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.MonkeyPatch.context() as m:
        m.setattr(fla_kernels, "_op", spying)
        _close(ours(x), theirs(x), TOLERANCE[torch.bfloat16])
    assert fed == [torch.bfloat16]
    assert a.dtypes == b.dtypes == [torch.bfloat16]


@pytest.mark.parametrize("name", MIXERS)
def test_a_prefill_then_decode_steps(name: str, calls: list[str]) -> None:
    """A left-padded prompt of 70 through the chunked op from an empty state, then two
    one-token steps through the fused recurrent one: outputs and states alike."""
    dtype = _dtype(name)
    torch.manual_seed(1)
    x = torch.randn(1, 72, D, dtype=dtype)
    mask = torch.zeros(1, 70, dtype=torch.bool)
    mask[0, :5] = True
    runs = []
    for layer, _ in _each(name, dtype):
        state = layer.new_state(1, 72, dtype, torch.device("cpu"))
        outs = [layer.extend(x[:, :70], state, mask)[~mask]]
        outs += [layer.extend(x[:, t : t + 1], state) for t in (70, 71)]
        runs.append([*outs, state.s])
    for ours, theirs in zip(*runs, strict=True):
        _close(ours, theirs, TOLERANCE[dtype])
    chunked, step = OPS[name]
    assert calls == [chunked, step, step]


@pytest.mark.parametrize("name", MIXERS)
def test_a_packed_batch_is_one_call_with_cu_seqlens(name: str, calls: list[str]) -> None:
    """Two rows of documents (30, 34, 16) and (64, 16): ours resets its state at each start
    in one pass; theirs runs all five documents end to end in one call."""
    dtype = _dtype(name)
    packing = Packing.of([(30, 34, 16), (64, 16)])
    torch.manual_seed(1)
    x = torch.randn(2, N, D, dtype=dtype)
    ours, theirs = _pair(name, dtype)
    _close(ours.attend_packed(x, packing), theirs.attend_packed(x, packing), TOLERANCE[dtype])
    assert calls == [OPS[name][0]]


@pytest.mark.parametrize("name", MIXERS)
def test_their_chunk_sizes_are_passed(name: str, calls: list[str]) -> None:
    """A chunk of 16 where the op takes one (all but GLA, whose chunk_gla is fixed at 64):
    the same outputs (a chunk changes speed, not results)."""
    if name == "gla":
        with pytest.raises(ValueError, match=r"^chunk: kernel=fla runs gla on chunk_gla, whose"):
            attnbench.create(name, d_model=D, n_heads=H, max_seq_len=N, kernel="fla", chunk=16)
        return
    dtype = _dtype(name)
    torch.manual_seed(1)
    x = torch.randn(1, 40, D, dtype=dtype)
    ours, _ = _pair(name, dtype)
    torch.manual_seed(0)
    theirs = attnbench.create(name, d_model=D, n_heads=H, max_seq_len=N, kernel="fla", chunk=16,
                              **SETTINGS.get(name, {})).to(dtype)  # fmt: skip
    theirs.load_state_dict(ours.state_dict())
    _close(ours(x), theirs(x), TOLERANCE[dtype])


@pytest.mark.parametrize(
    ("name", "setting", "says"),
    [
        ("deltanet", {"dtype": "fp32"}, "dtype: kernel=fla cannot run deltanet in fp32"),
        ("gla", {"dtype": "fp64"}, "dtype: must be one of fp32, fp16, bf16"),  # every cell's rule
        ("retnet", {"device": "cpu"}, "kernel: fla runs flash-linear-attention's Triton "
         "kernels on a CUDA GPU, and this cell's device is the CPU"),
        ("gated_deltanet", {"chunk": 128}, "chunk: kernel=fla runs gated_deltanet on "
         "chunk_gated_delta_rule, whose chunk is 16, 32 or 64; got 128"),
        ("mamba2", {"chunk": 48}, "chunk: kernel=fla runs mamba2 on chunk_simple_gla, whose "
         "chunk is a power of two >= 16; got 48"),
    ],
)  # fmt: skip
def test_what_their_ops_refuse_is_refused_at_validation(
    name: str, setting: dict, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a CUDA machine with fla installed (why_unavailable says nothing; no kernel
    runs): one line naming the key, before anything is built."""
    monkeypatch.setattr(fla_kernels, "why_unavailable", lambda: None)
    params = {"causal": True, "kernel": "fla", **{k: v for k, v in setting.items() if k == "chunk"}}
    device, dtype = setting.get("device", "v100_16gb"), setting.get("dtype", "fp16")
    cell = Cell(name, n=128, params=tuple(params.items()), device=device, dtype=dtype)
    with pytest.raises(ValueError) as e:
        validate(cell)
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    ("versions", "says"),
    [
        ({"torch": "2.6.0+cu124", "triton": "3.2.0"}, "needs torch >= 2.7, found 2.6.0+cu124"),
        ({"torch": "2.7.1", "triton": "3.2.0"}, "needs triton >= 3.3, found 3.2.0"),
    ],
)
def test_too_old_a_torch_or_triton_is_refused(
    versions: dict[str, str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fla_kernels, "_installed", lambda module: True)
    monkeypatch.setattr(fla_kernels, "versions", lambda: versions)
    assert says in (fla_kernels.why_unavailable() or "")
    with pytest.raises(ValueError, match=rf"^kernel: fla cannot run here: .*{re.escape(says)}"):
        attnbench.create("gla", d_model=D, n_heads=H, max_seq_len=N, kernel="fla")


def test_tritons_own_library_is_interpreted_whatever_imported_it_first(
    interpreted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the whole suite torch may import triton before the bridge, leaving Triton's own
    ``@jit`` functions (``tl.cumsum``) compiled-mode: every fla kernel that calls one then
    failed. The bridge decorates them again, once each, in every module that holds one."""
    import types

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def double(x):  # type: ignore[no-untyped-def]
        return x * 2

    compiled = JITFunction(double)
    for name in ("triton.language._probe_a", "triton.language._probe_b"):
        module = types.ModuleType(name)
        module.double = compiled  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)
    fla_interpret._interpret_triton_library()
    a, b = (sys.modules[n].double for n in ("triton.language._probe_a", "triton.language._probe_b"))
    assert isinstance(a, InterpretedFunction) and a is b and a.fn is double
