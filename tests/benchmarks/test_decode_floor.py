r"""The physical limit of a decode step: vanilla's KV cache against the copy bandwidth
(pytest-benchmark).

One shape: the 12-layer encoder of Table 3 in its decoder form (``build_model(...,
causal=True)``, d_model 768, 12 heads, d_ff 3072), batch 1, fp32 on the CPU, context n = 16384
(without ``--benchmark-enable``, the default test run, each case runs once, untimed, with 2
layers at n = 512: :func:`size_of`). Each round times ONE DECODE STEP of the whole model
(``model.extend`` of one token through every layer, its output the next step's input, as in
generation); the cache or state advances by a token a round, so the 15 timed steps (after 2
untimed) see n + 3 … n + 17 tokens (their mean, ``context``, is what every byte count is given
at).

**The caches are filled at random, not by a prefill**: every state is allocated at capacity,
moved to position n by its ``seek(n)`` and its floating tensors set uniform in (0, 1), as
``DecodeWork._random_fill`` does (attnbench/workload/decode.py) for a prompt a CPU cannot
prefill in time. A real prefill of 16384 tokens through 12 layers takes minutes on this CPU;
a step's time depends on the shapes it reads, not on the values.

**The floor**: a decode step is memory-bound: it reads the whole cache (or state) and every
weight once, and does about 2 FLOPs per number read. Its floor is (cache bytes + weight bytes)
÷ the copy bandwidth (``attnbench.measure.bandwidth.copy_bytes_per_s``: STREAM's convention,
read + write of a 256 MiB ``copy_``, measured once in this process, so in the same run).
The cache bytes are the model's own formula (``Encoder.state_bytes`` at ``context``), the
weight bytes ``attnbench.measure.memory.module_bytes``. The target, read from the medians
(never asserted: speed is for benchmarks only): vanilla's step ≤ 2 × its floor.

Beside it, in the same run, each against its own floor:

* ``sdpa`` (its KV cache, the fused kernel), ``local`` (window 256, a ring of the last 256
  keys) and ``linear`` (S and z per head, whatever n).
* grouped-query attention, ``kv_heads=3`` (4 query heads per key/value head): ``vanilla``
  (the groups' query heads stacked, no copy of K or V) and ``sdpa`` (``enable_gqa=True``;
  on the CPU a decode step runs ``_scaled_dot_product_flash_attention_for_cpu`` with the 3
  key/value heads as they are, no repeat op in the profiler).
* ``sdpa-gqa3-repeat``: the same model (its own projections and cache), each layer's
  attention replaced by :func:`repeat_extend_attend`: K and V expanded to 12 heads by
  ``repeat_interleave`` and a plain ``scaled_dot_product_attention`` call, what serving
  code did before ``enable_gqa``. Checked equal to the enable_gqa path first.
* ``vanilla-concat``: the naive cache, over the **whole model**: every layer keeps K and V
  as exactly the tokens so far and ``torch.cat``\ s the new token's k and v onto them each
  step (:func:`concat_extend_attend`, the same eager attention as vanilla's), so each step
  copies the whole cache. Against ``vanilla``: the preallocated cache's speed-up.
  Checked equal to the preallocated path first.
* ``linear-state-fp16``: linear with its state kept in fp16 (compute in fp32, the state cast
  on each read and write): half the state's bytes, 1.2 MB instead of 2.4 MB over 12 layers,
  beside 340 MB of weights a step reads either way; on a CPU it only shows the casts' cost.

Each benchmark records its bytes, the floor, the copy bandwidth and the load average in
``extra_info``; :func:`summary` turns the JSON into the table (``median / floor``, and the
ratios between variants).

    pytest tests/benchmarks/test_decode_floor.py --benchmark-enable --benchmark-only \
        --benchmark-json results/benchmarks/decode-floor-cpu.json
    python -m tests.benchmarks.test_decode_floor results/benchmarks/decode-floor-cpu.json
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.attention.cache import KVCache, grouped, ungrouped
from attnbench.attention.vanilla import softmax_attend
from attnbench.measure.memory import module_bytes
from attnbench.model import Encoder, build_model
from tests.benchmarks.floors import memory_floor, random_fill

N, D, H, LAYERS, D_FF, B = 16384, 768, 12, 12, 3072, 1
KV_HEADS, WINDOW = 3, 256
ROUNDS, WARMUP = 15, 2
CAPACITY = N + WARMUP + ROUNDS + 1  # every step the benchmark runs (one more when disabled)
CONTEXT = N + WARMUP + (ROUNDS + 1) // 2  # the mean tokens a timed step's new token sees
# the untimed run (without --benchmark-enable, the default test run): each case once, to show
# it runs, on a 2-layer model at n = 512 (the 12 layers' caches at N are GBs to fill)
SMOKE_N, SMOKE_LAYERS = 512, 2


def size_of(benchmark) -> tuple[int, int]:
    """(n, layers) a case runs at: (:data:`N`, :data:`LAYERS`) when timed, else the smoke's."""
    return (N, LAYERS) if benchmark.enabled else (SMOKE_N, SMOKE_LAYERS)


def _shape(n: int, layers: int) -> str:
    return (
        f"decode step, n={n} layers={layers} d_model={D} heads={H} d_ff={D_FF} batch={B} fp32 cpu"
    )


# id: (mechanism, its parameters, the state's dtype)
CASES: dict[str, tuple[str, dict[str, Any], torch.dtype]] = {
    "vanilla": ("vanilla", {}, torch.float32),
    "sdpa": ("sdpa", {}, torch.float32),
    "vanilla-gqa3": ("vanilla", {"kv_heads": KV_HEADS}, torch.float32),
    "sdpa-gqa3": ("sdpa", {"kv_heads": KV_HEADS}, torch.float32),
    "local-256": ("local", {"window": WINDOW}, torch.float32),
    "linear": ("linear", {}, torch.float32),
    "linear-state-fp16": ("linear", {}, torch.float16),
}


def _model(attention: str, *, n: int = N, layers: int = LAYERS, **params: Any) -> Encoder:
    torch.manual_seed(0)
    return build_model(
        attention,
        layers=layers,
        d_model=D,
        n_heads=H,
        d_ff=D_FF,
        max_seq_len=n + WARMUP + ROUNDS + 1,
        causal=True,
        **params,
    )


def _filled(model: Encoder, dtype: torch.dtype, n: int = N) -> list[Any]:
    states = model.new_state(B, n + WARMUP + ROUNDS + 1, dtype, "cpu")
    random_fill(states, n)
    return states


def _token(n: int = 0) -> Tensor:
    return torch.randn(B, 1, D, generator=torch.Generator().manual_seed(n))


# -- the variants written here, on the layers' own projections ---------------------------------


def repeat_extend_attend(attn: Any, x: Tensor, state: KVCache, key_padding_mask: Any) -> Tensor:
    """sdpa's decode over its preallocated cache with grouped heads, K and V repeated to
    ``n_heads`` by ``repeat_interleave`` (query head i reads key/value head i // g, as
    ``enable_gqa`` and :func:`attnbench.attention.cache.grouped` do) and a plain sdpa call."""
    assert key_padding_mask is None and x.shape[1] == 1  # decode steps without padding only
    q, k, v = attn.qkv_heads(x)  # (b, h, 1, dh); k, v (b, kv_heads, 1, dh)
    keys, values = state.append(k, v, None)  # (b, kv_heads, L, dh), views of the cache
    g = attn.n_heads // attn.kv_heads
    keys, values = keys.repeat_interleave(g, dim=1), values.repeat_interleave(g, dim=1)
    return attn.merge_heads(F.scaled_dot_product_attention(q, keys, values))  # (b, 1, d)


@dataclass
class Grown:
    """The naive cache: K and V (b, kv_heads, L, dh), exactly the L tokens so far."""

    k: Tensor
    v: Tensor


def concat_extend_attend(attn: Any, x: Tensor, state: Grown, key_padding_mask: Any) -> Tensor:
    """vanilla's decode step with the cache grown by ``torch.cat`` (a copy of the whole
    layer's cache each token), then the same eager attention over it."""
    assert key_padding_mask is None and x.shape[1] == 1
    q, k, v = attn.qkv_heads(x)
    state.k = torch.cat([state.k, k], dim=2)
    state.v = torch.cat([state.v, v], dim=2)
    out = softmax_attend(grouped(q, attn.kv_heads), state.k, state.v, None, attn.scale, False)
    return attn.merge_heads(ungrouped(out, attn.n_heads))  # (b, 1, d)


def _replace_attention(model: Encoder, extend_attend: Any) -> Encoder:
    """Each layer's ``extend_attend`` (what ``extend`` runs before ``out_proj``) replaced on
    the instance: the rest of the model, its weights and its step unchanged."""
    for layer in model.layers:
        layer.attn.extend_attend = functools.partial(extend_attend, layer.attn)
    return model


def _grown(preallocated: list[KVCache]) -> list[Grown]:
    """The naive cache holding what ``preallocated`` holds (a copy: contiguous, no room)."""
    return [
        Grown(s.k[:, :, : s.length].clone(), s.v[:, :, : s.length].clone()) for s in preallocated
    ]


def _same_steps(ours: Encoder, theirs: Encoder, ours_states: list, theirs_states: list) -> None:
    """Three decode steps of both agree."""
    x = y = _token(1)
    for _ in range(3):
        x, y = ours.extend(x, ours_states), theirs.extend(y, theirs_states)
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4)


# -- timing --------------------------------------------------------------------------------------


def _time_steps(benchmark, model: Encoder, states: list, variant: str, itemsize: int) -> None:
    """Time decode steps of ``model`` over ``states`` and record the step's floor."""
    n, layers = size_of(benchmark)
    context = n + WARMUP + (ROUNDS + 1) // 2  # CONTEXT, at this n
    token = [_token()]

    def step() -> None:
        token[0] = model.extend(token[0], states)  # the output is the next step's input

    benchmark.extra_info.update(
        variant=variant,
        context=context,
        **memory_floor(B * model.state_bytes(context, itemsize), module_bytes(model)),
        shape=_shape(n, layers),
    )
    benchmark.pedantic(step, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    states.clear()  # the cache goes before the next benchmark builds its own


@pytest.mark.parametrize("case", CASES)
def test_decode_step(benchmark, case: str) -> None:
    attention, params, dtype = CASES[case]
    n, layers = size_of(benchmark)
    with torch.inference_mode():
        model = _model(attention, n=n, layers=layers, **params)
        _time_steps(benchmark, model, _filled(model, dtype, n), case, dtype.itemsize)


def test_sdpa_gqa_repeat(benchmark) -> None:
    with torch.inference_mode():
        small = dict(n=64, layers=2, kv_heads=KV_HEADS)
        ours, theirs = _model("sdpa", **small), _model("sdpa", **small)
        _replace_attention(theirs, repeat_extend_attend)
        _same_steps(
            ours, theirs, _filled(ours, torch.float32, 64), _filled(theirs, torch.float32, 64)
        )

        n, layers = size_of(benchmark)
        model = _model("sdpa", n=n, layers=layers, kv_heads=KV_HEADS)
        model = _replace_attention(model, repeat_extend_attend)
        _time_steps(benchmark, model, _filled(model, torch.float32, n), "sdpa-gqa3-repeat", 4)


def test_vanilla_concat(benchmark) -> None:
    with torch.inference_mode():
        ours, theirs = _model("vanilla", n=64, layers=2), _model("vanilla", n=64, layers=2)
        _replace_attention(theirs, concat_extend_attend)
        states = _filled(ours, torch.float32, 64)
        _same_steps(ours, theirs, states, _grown(states))

        n, layers = size_of(benchmark)
        model = _model("vanilla", n=n, layers=layers)
        filled = _filled(model, torch.float32, n)
        grown = _grown(filled)
        del filled
        _time_steps(
            benchmark, _replace_attention(model, concat_extend_attend), grown, "vanilla-concat", 4
        )


# -- the figures -----------------------------------------------------------------------------------


def summary(data: dict) -> str:
    """The Markdown table of a pytest-benchmark JSON of this file: each variant's median
    step against its floor, then the ratios between variants (medians of the same run)."""
    rows = {b["extra_info"]["variant"]: (b["stats"], b["extra_info"]) for b in data["benchmarks"]}
    med = {v: s["median"] for v, (s, _) in rows.items()}
    e0 = next(iter(rows.values()))[1]
    loads = [e["load_avg"][0] for _, e in rows.values()]
    out = [
        f"{e0['shape']}, context {e0['context']}, {e0['threads']} threads; copy bandwidth "
        f"{e0['copy_bytes_per_s'] / 1e9:.1f} GB/s (read + write); load average (1 min) "
        f"{min(loads):.2f}–{max(loads):.2f}; machine: "
        f"{data['machine_info'].get('cpu', {}).get('brand_raw', '?')}",
        "",
        "| variant | median ms | IQR ms | cache MB | weights MB | floor ms | median / floor "
        "| achieved GB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v, (s, e) in rows.items():
        out.append(
            f"| {v} | {s['median'] * 1e3:.1f} | {s['iqr'] * 1e3:.1f} | "
            f"{e['state_bytes'] / 1e6:.1f} | {e['weight_bytes'] / 1e6:.1f} | "
            f"{e['floor_s'] * 1e3:.1f} | {s['median'] / e['floor_s']:.2f} | "
            f"{e['read_bytes'] / s['median'] / 1e9:.1f} |"
        )
    pairs = [
        ("vanilla-concat", "vanilla", "torch.cat cache / preallocated (vanilla)"),
        ("sdpa-gqa3-repeat", "sdpa-gqa3", "repeat_interleave + sdpa / enable_gqa (kv_heads=3)"),
        ("vanilla", "vanilla-gqa3", "vanilla kv_heads=12 / kv_heads=3"),
        ("sdpa", "sdpa-gqa3", "sdpa kv_heads=12 / kv_heads=3"),
        ("linear-state-fp16", "linear", "linear state fp16 / fp32"),
    ]
    out.append("")
    for a, b, what in pairs:
        if a in med and b in med:
            out.append(
                f"- {what}: {med[a] / med[b]:.2f}× ({med[a] * 1e3:.1f} / {med[b] * 1e3:.1f} ms)"
            )
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summary(json.load(f)))
