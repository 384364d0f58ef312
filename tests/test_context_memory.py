"""Each mechanism's context memory: ``context_elements(n)``, the elements per sequence and
layer that carry the context, and ``context_bytes(n, itemsize)``.

Held against a hand count written here, independent of the code (one rule per mechanism,
every built-in one: a new one fails until it declares one and this file counts it),
against the tensors that hold it where there are any (a decoder's ``new_state``, Linformer's
projected keys and values, Nyströmformer's landmarks as they reach the kernel), and, for a
decoder, against its ``state_bytes``: the same code path, which is the context memory plus
its padding flags.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnbench
from attnbench import registry
from attnbench.attention.base import MultiHeadAttention
from attnbench.model import build_model

D, H, N = 32, 4, 64
DH = D // H
K = 16  # Linformer's k (divides N: the pooled projections' windows are N/k = 4)
W = 16  # local's and flex's window
M = 8  # Performer's features, Nyströmformer's landmarks
NS = (1, 5, 16, 17, 40, N)  # below, at and above each budget
CPU = torch.device("cpu")


def _kv(params: dict[str, Any]) -> int:
    return params.get("kv_heads", H)


def hand(name: str, params: dict[str, Any], n: int) -> int:
    """The context memory counted by hand from the mechanism's description."""
    if name in ("vanilla", "sdpa", "xformers"):  # K and V of every token
        return 2 * _kv(params) * DH * n
    if name == "flex":
        keys = min(params.get("window", 256), n) if params.get("pattern") == "window" else n
        return 2 * _kv(params) * DH * keys
    if name == "local":  # the window's keys and values
        return 2 * _kv(params) * DH * min(params["window"], n)
    if name == "linear":  # S (d_h × d_h) and z (d_h) per head
        return H * (DH * DH + DH)
    if name == "performer":  # S (m × d_h) and z (m) per head
        return H * (params["nb_features"] * DH + params["nb_features"])
    if name == "linformer":  # k projected keys and k projected values of d each
        k = params["k"]
        if params["projection"] in ("mean", "max", "conv"):  # windows of N/k starting before n
            k = math.ceil(n / (N // k))
        return 2 * k * D
    if name == "nystromformer":  # m landmark keys and m summaries; the conv's window of V
        m = min(params["num_landmarks"], n)
        return 2 * m * D + min(params["conv_kernel"], n) * D
    if name == "reformer":  # every key and value
        return 2 * D * n
    if name == "mla":  # one latent and one RoPE key a token, shared by every head
        return (params.get("latent", 256) + params.get("rope_dim", 32)) * n
    window = max(params.get("conv", 4) - 1, 0)  # the short convolution's last K − 1 inputs
    if name in ("retnet", "gla"):  # S (d_h × d_h) per head, no convolution
        return H * DH * DH
    if name == "mamba2":  # S (N × d_h) per head; the window of x, B and C
        n_state, groups = params.get("d_state", 64), params.get("groups", 1)
        return H * n_state * DH + window * (D + 2 * groups * n_state)
    if name in ("deltanet", "gated_deltanet"):  # S (d_h × d_h) per value head; q, k, v's window
        vh = params.get("v_heads", H)  # value heads: v's channels, vh·d_h
        return vh * DH * DH + window * (2 * D + vh * DH)
    if name == "kda":  # as Gated DeltaNet's: S (d_h × d_h) per head; the window of q, k, v
        return H * DH * DH + window * 3 * D
    raise AssertionError(f"{name}: no hand count; add one for a new mechanism")


CASES: list[tuple[str, dict[str, Any]]] = [
    ("vanilla", {}),
    ("vanilla", {"causal": True, "kv_heads": 2}),
    ("sdpa", {"causal": True}),
    ("sdpa", {"kv_heads": 1}),
    ("xformers", {"causal": True, "kv_heads": 2}),
    *[
        ("linformer", {"k": K, "sharing": s, "projection": p})
        for s in ("none", "headwise", "kv", "layerwise")
        for p in ("linear", "random", "mean", "max", "conv")
    ],
    ("performer", {"nb_features": M}),
    ("performer", {"nb_features": M, "causal": True}),
    ("nystromformer", {"num_landmarks": M, "conv_kernel": 0}),
    ("nystromformer", {"num_landmarks": M, "conv_kernel": 33}),
    ("nystromformer", {"num_landmarks": M, "conv_kernel": 5}),
    ("linear", {}),
    ("linear", {"causal": True}),
    ("local", {"window": W}),
    ("local", {"window": W, "causal": True}),
    ("local", {"window": W, "causal": True, "kv_heads": 2}),
    ("reformer", {"bucket_size": 8}),
    ("reformer", {"bucket_size": 8, "causal": True}),
    ("flex", {"pattern": "full"}),
    ("flex", {"pattern": "causal", "kv_heads": 2}),
    ("flex", {"pattern": "window", "window": W}),
    ("flex", {"pattern": "window", "window": W, "causal": True, "kv_heads": 1}),
    ("retnet", {"causal": True}),
    ("gla", {"causal": True}),
    ("mamba2", {"causal": True}),
    ("mamba2", {"causal": True, "d_state": 8, "groups": 2, "conv": 0}),
    ("mamba2", {"causal": True, "d_state": 4, "conv": 2}),
    ("deltanet", {"causal": True}),
    ("deltanet", {"causal": True, "conv": 0}),
    ("gated_deltanet", {"causal": True, "conv": 3}),
    ("gated_deltanet", {"causal": True, "v_heads": 2 * H}),
    ("kda", {"causal": True}),
    ("kda", {"causal": True, "conv": 0}),
    ("mla", {}),
    ("mla", {"causal": True, "latent": 12, "rope_dim": 4}),
    ("mla", {"causal": True, "latent": 6, "rope_dim": 2, "q_latent": 8, "form": "absorbed"}),
]
DECODERS = [
    (name, p)
    for name, p in CASES
    if attnbench.info(name).cannot_decode is None and p.get("causal", False)
]


def _ids(case: Any) -> str:
    if isinstance(case, dict):
        return "-".join(f"{k}={v}" for k, v in case.items()) or "defaults"
    return str(case)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def create(name: str, params: dict[str, Any]) -> MultiHeadAttention:
    torch.manual_seed(0)
    return attnbench.create(name, d_model=D, n_heads=H, max_seq_len=N, **params)


def uncounted(builtins: Sequence[str]) -> list[str]:
    """One line per gap between the built-ins and this file's census, naming what to edit:
    a new built-in fails here until it is counted, not with a set difference to decode."""
    counted = {name for name, _ in CASES}
    return [
        *(f"add a hand count for {name} in tests/test_context_memory.py (a CASES entry and "
          f"its rule in hand())" for name in builtins if name not in counted),
        *(f"{name}: counted in tests/test_context_memory.py's CASES but not a built-in "
          f"(attnbench/registry.py's BUILTINS): take it out" for name in sorted(counted)
          if name not in builtins),
    ]  # fmt: skip


def test_every_built_in_mechanism_declares_its_context_memory() -> None:
    """Every built-in mechanism overrides ``context_elements`` and is counted here; a
    plugin's (tests/toys/toy_mechanism.py) is its author's, and is not counted here."""
    gaps = uncounted(registry.BUILTINS)
    assert not gaps, "\n".join(gaps)
    for name in registry.BUILTINS:
        cls = type(create(name, next(p for c, p in CASES if c == name)))
        assert cls.context_elements is not MultiHeadAttention.context_elements, (
            f"{name}: its class ({cls.__module__}) does not override context_elements"
        )


@pytest.mark.parametrize(("name", "params"), CASES, ids=_ids)
def test_context_memory_is_the_hand_count(name: str, params: dict[str, Any]) -> None:
    m = create(name, params)
    for n in NS:
        assert m.context_elements(n) == hand(name, params, n), (name, params, n)
        for itemsize in (2, 4):
            assert m.context_bytes(n, itemsize) == hand(name, params, n) * itemsize


def _state_tensors(state: Any) -> tuple[int, int]:
    """(elements of its floating tensors, bytes of its bool ones): the context a state keeps,
    and its padding flags."""
    values = [getattr(state, f.name) for f in dataclasses.fields(state)]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    elements = sum(t.numel() for t in tensors if t.is_floating_point())
    flags = sum(t.untyped_storage().nbytes() for t in tensors if t.dtype == torch.bool)
    return elements, flags


@pytest.mark.parametrize(("name", "params"), DECODERS, ids=_ids)
def test_a_decoders_context_is_what_its_state_holds_less_the_flags(
    name: str, params: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instrument: the state ``new_state`` makes at capacity n (the K/V cache, local's
    ring, S and z). Its floating tensors hold exactly the context memory; state_bytes is the
    context bytes plus the bool padding flags, nothing else."""
    m = create(name, params)
    for n in NS:
        elements, flags = _state_tensors(m.new_state(1, n, torch.float32, CPU))
        assert m.context_elements(n) == elements, (name, params, n)
        for itemsize in (2, 4):
            assert m.state_bytes(n, itemsize) == m.context_bytes(n, itemsize) + flags
    # one formula: state_bytes is computed from context_elements, not beside it
    monkeypatch.setattr(m, "context_elements", lambda n: 1_000_003)
    for n in NS:
        _, flags = _state_tensors(m.new_state(1, n, torch.float32, CPU))
        assert m.state_bytes(n, 2) == 2 * 1_000_003 + flags, (name, params, n)


def _kernel_inputs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The keys and values of every fused-attention call from now on."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    sdpa = F.scaled_dot_product_attention

    def record(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        calls.append((k, v))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", record)
    return calls


@pytest.mark.parametrize("params", [p for name, p in CASES if name == "linformer"], ids=_ids)
def test_linformers_context_is_the_projected_keys_and_values(
    params: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instrument: the keys and values its attention kernel is given, per sequence."""
    m = create("linformer", params)
    b = 2
    for n in (5, 40, N):
        calls = _kernel_inputs(monkeypatch)
        with torch.no_grad():
            m(torch.randn(b, n, D))
        ((k, v),) = calls
        assert (k.numel() + v.numel()) // b == m.context_elements(n), (params, n)


@pytest.mark.parametrize("conv_kernel", [0, 5])
def test_nystromformers_landmarks_are_what_its_queries_attend(
    conv_kernel: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instrument: the second kernel call, softmax(Q K̃ᵀ) W, attends over the m landmark
    keys and their m summaries; the rest is the convolution's window of V."""
    m = create("nystromformer", {"num_landmarks": M, "conv_kernel": conv_kernel})
    b = 2
    for n in (5, 40, N):
        calls = _kernel_inputs(monkeypatch)
        with torch.no_grad():
            m(torch.randn(b, n, D))
        _, (k_l, w) = calls  # B V, then F (A⁺ B V)
        window = min(conv_kernel, n) * D
        assert (k_l.numel() + w.numel()) // b + window == m.context_elements(n), n


def test_the_encoder_gives_each_layers_context_and_their_sum() -> None:
    """Per layer: Linformer's k_decay sizes its layers apart, layerwise sharing does not
    merge them; the sum is the model's, beside state_bytes for a decoder."""
    kw = {"layers": 3, "d_model": D, "n_heads": H, "d_ff": 64, "max_seq_len": N}
    decayed = build_model("linformer", k=K, k_decay=0.5, **kw)
    assert decayed.layer_context_elements(N) == [2 * 16 * D, 2 * 8 * D, 2 * 4 * D]
    assert decayed.layer_context_bytes(N, 2) == [4 * 16 * D, 4 * 8 * D, 4 * 4 * D]
    assert decayed.context_elements(N) == 2 * 28 * D
    assert decayed.context_bytes(N, 4) == 8 * 28 * D
    shared = build_model("linformer", k=K, sharing="layerwise", **kw)
    assert shared.layer_context_elements(N) == [2 * K * D] * 3
    cache = build_model("vanilla", causal=True, **kw)
    for n in NS:
        assert cache.layer_context_elements(n) == [2 * D * n] * 3
        assert cache.state_bytes(n, 2) == cache.context_bytes(n, 2) + 3 * n  # flags
    ring = build_model("local", window=W, causal=True, **kw)
    assert ring.state_bytes(N, 4) == 3 * (2 * D * W * 4 + W)
