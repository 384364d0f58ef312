"""Attention sinks and the output gate (attnbench/attention/sinks_gate.py) on the four softmax
mechanisms: against an independent float64 softmax over [scores, sink] with the sink's
column dropped (gpt-oss's rule), against a hand-computed gate, through decode, packing,
gradients, FLOPs, the memory model, and the one-line refusals."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import attnbench
from attnbench.attention.packing import Packing
from attnbench.cell import Cell
from attnbench.measure.flops import count_flops
from attnbench.plan import validate
from tests.conftest import assert_peaks_match_the_profiler

D, H, N, W = 32, 4, 40, 8  # local's and flex's window w = 8
SOFTMAX = ("vanilla", "sdpa", "local", "flex")


def _layer(name: str, causal: bool, dtype: torch.dtype = torch.float64, **params: object):
    if name == "local":
        params["window"] = W
    if name == "flex":
        params.update(pattern="window", window=W)
    layer = attnbench.create(name, d_model=D, n_heads=H, max_seq_len=64, causal=causal, **params)
    return layer.to(dtype).eval()


def _reference(layer, x: Tensor, pad: Tensor, causal: bool, window: int | None) -> Tensor:
    """softmax over [QKᵀ·scale, s_h] in float64, the sink column dropped, times V: each
    query sees the keys its pattern allows (a band of ``window``) that are not padding."""
    q, k, v = (layer.split_heads(p(x)).double() for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    scores = q @ k.transpose(-2, -1) / (layer.head_dim**0.5)  # (b, h, n, n)
    i = torch.arange(x.shape[1])[:, None]
    j = torch.arange(x.shape[1])[None, :]
    blocked = pad[:, None, None, :].expand_as(scores).clone()
    if causal:
        blocked |= j > i
    if window is not None:
        blocked |= (j <= i - window) if causal else (i - j).abs() > window // 2
    scores = scores.masked_fill(blocked, float("-inf"))
    sink = layer.sinks.double()[None, :, None, None].expand(*scores.shape[:3], 1)
    probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return layer.merge_heads(probs @ v)


def _padded_x(b: int = 2, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    x = torch.randn(b, N, D, dtype=dtype)
    pad = torch.zeros(b, N, dtype=torch.bool)
    pad[1, -7:] = True  # the second sequence 7 shorter (right padding: every query sees a key)
    return x, pad


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", SOFTMAX)
def test_sinks_equal_the_float64_reference(name: str, causal: bool) -> None:
    dtype = torch.float32 if name == "flex" else torch.float64  # flex's CPU dtypes
    layer = _layer(name, causal, dtype, sinks=True)
    with torch.no_grad():
        layer.sinks.copy_(torch.tensor([-1.0, 0.0, 1.5, 4.0]))  # up to most of each row's mass
    x, pad = _padded_x(dtype=dtype)
    window = W if name in ("local", "flex") else None
    with torch.no_grad():
        got = layer.attend(x, pad)
        want = _reference(layer, x, pad, causal, window)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    # the sinks took mass: without them the outputs differ
    assert (got.double() - _no_sink(layer, x, pad)).abs().max() > 1e-2


def _no_sink(layer, x: Tensor, pad: Tensor) -> Tensor:
    sinks = layer.sinks.detach().clone()
    with torch.no_grad():
        layer.sinks.fill_(float("-inf"))
        out = layer.attend(x, pad).double()
        layer.sinks.copy_(sinks)
    return out


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", SOFTMAX)
def test_a_sink_of_minus_infinity_is_no_sink(name: str, causal: bool) -> None:
    dtype = torch.float32 if name == "flex" else torch.float64
    with_sinks = _layer(name, causal, dtype, sinks=True)
    plain = _layer(name, causal, dtype)
    plain.load_state_dict({k: v for k, v in with_sinks.state_dict().items() if k != "sinks"})
    x, pad = _padded_x(dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    with torch.no_grad():  # flex has no CPU backward
        want = plain.attend(x, pad).double()
    torch.testing.assert_close(_no_sink(with_sinks, x, pad), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", ["vanilla", "sdpa", "local"])
def test_prefill_and_decode_equal_the_forward_with_sinks_and_gate(name: str) -> None:
    layer = _layer(name, True, sinks=True, gate="elementwise")
    with torch.no_grad():
        layer.sinks.normal_(0.0, 2.0)
    b, n, prompt = 2, 20, 13  # local's ring (w = 8) wraps
    x = torch.randn(b, n, D, dtype=torch.float64)
    pad = torch.zeros(b, n, dtype=torch.bool)
    pad[1, :3] = True  # left padding, as attnbench pads prompts
    with torch.no_grad():
        want = layer(x, pad)
        state = layer.new_state(b, n, torch.float64, x.device)
        outs = [layer.extend(x[:, :prompt], state, pad[:, :prompt])]
        outs += [layer.extend(x[:, t : t + 1], state) for t in range(prompt, n)]
    got = torch.cat(outs, dim=1)
    real = ~pad  # a padding position's own output is nobody's
    torch.testing.assert_close(got[real], want[real], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", ["vanilla", "sdpa", "local", "flex"])
def test_packed_documents_with_sinks_are_each_alone(name: str) -> None:
    dtype = torch.float32 if name == "flex" else torch.float64
    layer = _layer(name, True, dtype, sinks=True, gate="headwise")
    with torch.no_grad():
        layer.sinks.normal_(0.0, 2.0)
    lengths = (11, 9, 20)
    x = torch.randn(1, sum(lengths), D, dtype=dtype)
    packing = Packing.of([lengths])
    with torch.no_grad():
        got = layer(x, packing=packing)
        starts = [0, 11, 20]
        alone = [layer(x[:, s : s + n]) for s, n in zip(starts, lengths, strict=True)]
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got, torch.cat(alone, dim=1), atol=tol, rtol=tol)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_the_gate_against_a_hand_computation(gate: str) -> None:
    layer = _layer("vanilla", False, gate=gate)
    x, pad = _padded_x()
    with torch.no_grad():
        attended = layer.attend(x, pad)  # (b, n, d), heads merged
        g = torch.sigmoid(x @ layer.output_gate.weight.T + layer.output_gate.bias)
        dh = D // H
        if gate == "headwise":  # one gate per head, on each of its dh channels
            assert g.shape[-1] == H
            g = g.repeat_interleave(dh, dim=-1)
        want = layer.out_proj(attended * g)
        torch.testing.assert_close(layer(x, pad), want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", ["vanilla", "sdpa", "local"])
def test_gradients_reach_the_sinks_and_the_gate(name: str) -> None:
    layer = _layer(name, True, sinks=True, gate="headwise").train()
    x, pad = _padded_x()
    layer(x, pad).square().sum().backward()
    for p in (layer.sinks, layer.output_gate.weight, layer.output_gate.bias):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_gradient_of_the_sink_is_the_analytic_one() -> None:
    """d out / d s_h: each row's weights p_j = e^{z_j} / (Σ + e^s) give ∂(Σ_j p_j v_j)/∂s =
    −σ(s − L)·out, summed here against a float64 finite difference."""
    layer = _layer("vanilla", False, sinks=True)
    x, pad = _padded_x()
    loss = layer(x, pad).sum()
    (grad,) = torch.autograd.grad(loss, layer.sinks)
    eps = 1e-6
    with torch.no_grad():
        layer.sinks[2] += eps
        up = layer(x, pad).sum()
        layer.sinks[2] -= 2 * eps
        down = layer(x, pad).sum()
    torch.testing.assert_close(grad[2], (up - down) / (2 * eps), atol=1e-6, rtol=1e-6)


def test_defaults_add_no_parameter() -> None:
    """Off by default: no sink, no gate projection, the state dict as before."""
    for name in SOFTMAX:
        layer = _layer(name, False)
        assert layer.sinks is None and layer.output_gate is None
        assert set(layer.state_dict()) == {
            f"{p}_proj.{w}" for p in ("q", "k", "v", "out") for w in ("weight", "bias")
        }


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("vanilla", {"gate": "rows"}, r"^gate: must be one of none, headwise, elementwise"),
        ("local", {"sinks": "yes"}, r"^sinks: must be"),
        ("sdpa", {"sinks": True, "backend": "flash"}, r"^backend: no sdpa kernel takes a sink"),
        ("linear", {"sinks": True}, r"^sinks: attention=linear cannot hold an attention sink"),
        ("performer", {"gate": "headwise"}, r"^gate: attention=performer cannot hold an output"),
    ],
)
def test_bad_values_are_one_line(name: str, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        attnbench.create(name, d_model=D, n_heads=H, max_seq_len=64, **params)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("linear", r"^sinks: attention=linear cannot hold .*; sinks works with vanilla, sdpa, "
         r"local, flex$"),
        ("flex", r"^sinks: flex's compiled CPU kernel returns no log-sum-exp"),
    ],
)  # fmt: skip
def test_a_cell_with_sinks_where_they_cannot_be_held_is_refused(name: str, message: str) -> None:
    """The path a sweep's and the CLI's cells take (plan.validate): one line."""
    cell = Cell(name, n=64, k=None, dtype="fp32", device="cpu", params=(("sinks", True),))
    with pytest.raises(ValueError, match=message) as e:
        validate(cell)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("vanilla", {"sinks": True, "gate": "elementwise"}),
        ("sdpa", {"sinks": True, "gate": "headwise", "causal": True}),
        ("sdpa", {"gate": "headwise"}),  # the kernel kept, the gate counted
        ("local", {"window": 16, "sinks": True, "gate": "headwise"}),
    ],
    ids=str,
)
def test_analytic_flops_count_the_gate(name: str, params: dict) -> None:
    b, n, d = 3, 40, 32
    model = attnbench.build_model(
        name, layers=2, d_model=d, n_heads=4, d_ff=48, max_seq_len=64, **params
    )
    assert model.flops(b, n) == count_flops(model, torch.randn(b, n, d))
    plain = {k: v for k, v in params.items() if k not in ("sinks", "gate")}
    base = attnbench.build_model(name, layers=2, d_model=d, n_heads=4, d_ff=48, max_seq_len=64,
                                 **plain)  # fmt: skip
    width = d if params.get("gate") == "elementwise" else 4
    assert model.flops(b, n) - base.flops(b, n) == 2 * 2 * b * n * d * width  # 2 layers


@pytest.mark.parametrize(
    ("name", "params"),
    [("vanilla", {"sinks": True, "gate": "elementwise"}),
     ("local", {"window": 64, "sinks": True, "gate": "headwise", "causal": True})],
    ids=str,
)  # fmt: skip
def test_modeled_peaks_with_sinks_and_gate_match_the_profiler(name: str, params: dict) -> None:
    assert_peaks_match_the_profiler(name, **params)


def test_the_sink_softmax_backward_is_autograds() -> None:
    """The weights-only backward (sinks_gate._SinkSoftmax) against finite differences, the
    sink broadcast over the batch and a row's keys, and a blocked key among them."""
    from attnbench.attention.sinks_gate import sink_softmax

    scores = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    scores[:, :, 1, 2] = float("-inf")
    scores.requires_grad_()
    sink = torch.randn(3, 1, 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z, s: sink_softmax(z, s).masked_fill(z.isinf(), 0),
                                    (scores, sink))  # fmt: skip
