r"""The five recurrent mixers (``retnet``, ``gla``, ``mamba2``, ``deltanet``,
``gated_deltanet``): their chunked forms against the matmul floor and against their
token-by-token references, their decode steps against the memory floor, and the chunk-size
curve (pytest-benchmark).

One shape: n = 4096, d_model 768, 12 heads (dk = dv = 64; Mamba-2's core: d_state N = 64,
P = 64), batch 1, fp32 on the CPU, causal, at the threads torch uses (2 on the reference
machine). Without ``--benchmark-enable`` (the default test run) each case runs once, untimed,
at n = :data:`SMOKE_N` (the references at :data:`SMOKE_REF_N`). ``ATTNBENCH_MIXER_N`` sets the
timed n (a quick timed smoke run) and ``ATTNBENCH_MIXER_REF_N`` the references' (default: the
same n) (:func:`n_of`, :func:`ref_n_of`).

What is timed, each in the same process (so the rate and the bandwidth are the same run's):

* ``core``: the chunked core alone, :func:`~attnbench.attention.gated_scan.gated_chunked` or
  :func:`~attnbench.attention.delta_scan.delta_chunked`, on random inputs with each layer's
  gate shapes (:func:`core_inputs`): RetNet's fixed decay (1, h, 1, 1) with its γ_h and
  q scaled by 1/√dk; GLA's per key dimension (b, h, n, dk), log σ(·)/16; Mamba-2's scalar
  Δ·A (b, h, n, 1), scale 1; DeltaNet g = None; Gated DeltaNet Δ·A (b, h, n); the delta
  cores with L2-normalised q and k, q scaled by 1/√dk, β = σ(·) ∈ (0, 1). At every chunk of
  :data:`CHUNKS` (the chunk-size curve); the row at the layers' default chunk (64) is the
  core's row of the speed table. Its FLOPs are the core's ``chunked_flops`` (× b·h), and
  FlopCounterMode's count of the same call is recorded beside it.
* ``reference``: the token-by-token oracle (``gated_reference`` / ``delta_reference``) on the
  same inputs (3 rounds after 1 warm-up: it is the slow one). Its ratio to the core is per
  token, (reference median ÷ its n) ÷ (core median ÷ n): the plain ratio of medians when the
  two n are equal, as they are unless ``ATTNBENCH_MIXER_REF_N`` says otherwise.
* ``layer``: the whole layer, ``attnbench.create(name, d_model=768, n_heads=12,
  max_seq_len=n)`` (causal, its default chunk), ``eval()``, a forward under
  ``torch.inference_mode()``; its FLOPs ``layer.flops(1, n)`` (FlopCounterMode's beside).
* ``decode``: one decode step of that layer, ``layer.extend`` of one token (its output the
  next step's input) from ``layer.new_state(1, n + 1, fp32, "cpu")`` filled at random
  (``floors.random_fill``, as test_decode_floor.py: a step's time depends on the shapes it
  reads, not the values, and a state is never timed on zeros). Its memory floor is
  (state bytes + weight bytes) ÷ the copy bandwidth (``floors.memory_floor``, as
  test_decode_floor.py's); the state is fixed-size, whatever n. One layer's weights (8 to
  12 MB) fit a server CPU's last-level cache, where a model's 12 layers (test_decode_floor.py)
  do not: each step is timed twice, ``flushed`` (a 256 MiB read, untimed, before each step,
  so that the step reads from memory as the floor assumes: the figure held to it) and
  ``warm`` (steps back to back, the layer cache-resident: it can beat the floor).
* ``decode-linears``: the step's weight reads alone, every ``nn.Linear`` of the layer
  applied to one token after the same flush: how much of a flushed step reading its weights
  through torch's GEMV takes, and so how much the step's other ops do.
* ``matmul``: the fp32 GEMM at the layer's shape (n × d @ d × d), as test_forward_speed.py's:
  the rate every matmul floor divides by (FLOPs ÷ its median). ``cpu_matmul_rate()`` (a
  1024² GEMM, what the runner estimates a cell's cost with) is recorded beside it, and
  ``matmul-chunk`` times the cores' own matmul shape (batched 64 × 64 @ 64 × 64): how fast
  those matmuls can go here. A core's ``median / block floor`` divides by that rate: above
  1, the time its matmuls' shape does not explain.

The targets (#33), read from the medians, never asserted (speed is for benchmarks only):
each chunked form within 1.5× its matmul floor, at least 5× faster than its reference, and
each decode step within 2× its memory floor. :func:`summary` turns the JSON into the tables.

    pytest tests/benchmarks/test_mixer_speed.py --benchmark-enable --benchmark-only \
        --benchmark-json results/benchmarks/mixers-cpu.json
    python -m tests.benchmarks.test_mixer_speed results/benchmarks/mixers-cpu.json \
        > results/benchmarks/mixers-cpu.md
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import attnbench
from attnbench.attention import delta_scan, gated_scan
from attnbench.measure.bandwidth import COPY_BYTES
from attnbench.measure.flops import count_flops
from attnbench.measure.gemm import cpu_matmul_rate
from attnbench.measure.memory import module_bytes
from tests.benchmarks.floors import memory_floor, random_fill

N = int(os.environ.get("ATTNBENCH_MIXER_N", "4096"))
REF_N = int(os.environ.get("ATTNBENCH_MIXER_REF_N", str(N)))
D, H, B = 768, 12, 1
DH = D // H  # dk = dv = 64; Mamba-2's P (d_model / heads), and its d_state N below
D_STATE = 64  # Mamba-2's default
MIXERS = ("retnet", "gla", "mamba2", "deltanet", "gated_deltanet")
DELTA = ("deltanet", "gated_deltanet")
CHUNKS = (16, 32, 64, 128, 256)
CHUNK = 64  # every mixer's default chunk
assert CHUNK == gated_scan.DEFAULT_CHUNK == delta_scan.DEFAULT_CHUNK
ROUNDS, WARMUP = 7, 2  # test_forward_speed.py's
REF_ROUNDS, REF_WARMUP = 3, 1  # the token-by-token reference: seconds a call at n = 4096
STEP_ROUNDS, STEP_WARMUP = 100, 10  # a decode step of one layer: a fraction of a millisecond
CACHES = ("flushed", "warm")  # a decode step after a 256 MiB read, or right after the last
SMOKE_N = 256  # the untimed run's n: every chunk of CHUNKS fits, and more than one at 16..128
SMOKE_REF_N = 64  # the untimed run's reference: a loop over tokens, it only has to run


def n_of(benchmark) -> int:
    """The n a case runs at: :data:`N` when timed (``--benchmark-enable``), else
    :data:`SMOKE_N` (the default test run runs each case once to show it runs)."""
    return N if benchmark.enabled else SMOKE_N


def ref_n_of(benchmark) -> int:
    """The reference's n: :data:`REF_N` when timed, else :data:`SMOKE_REF_N`."""
    return REF_N if benchmark.enabled else SMOKE_REF_N


def _shape(n: int) -> str:
    return f"n={n} d_model={D} heads={H} dk=dv={DH} d_state={D_STATE} batch={B} fp32 cpu causal"


# -- the cores' inputs -------------------------------------------------------------------------


def _delta_t(gen: torch.Generator, n: int) -> Tensor:
    """Δ·A ≤ 0 per head and position, (b, h, n), as Mamba-2's and Gated DeltaNet's layers make
    it at their initialisation: Δ = softplus(b_Δ + x·w) with softplus(b_Δ) log-uniform in
    [0.001, 0.1] and x·w ~ N(0, 1/3) (a unit input through an nn.Linear's default init),
    A = exp(a_log) uniform in [1, 16]."""
    dt = torch.empty(H).uniform_(math.log(1e-3), math.log(0.1), generator=gen).exp()
    bias = dt + torch.log(-torch.expm1(-dt))  # softplus⁻¹
    pre = bias[:, None] + torch.randn(B, H, n, generator=gen) / math.sqrt(3)
    a = torch.empty(H).uniform_(1, 16, generator=gen)
    return -F.softplus(pre) * a[:, None]


def core_inputs(name: str, n: int) -> tuple[tuple[Tensor | None, ...], dict[str, Any]]:
    """The positional and keyword arguments of ``name``'s core at n, random from a fixed seed,
    in the gate shape the layer gives its core (module docstring)."""
    gen = torch.Generator().manual_seed(0)

    def r(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen)

    q, k, v = r(B, H, n, DH), r(B, H, n, DH), r(B, H, n, DH)
    if name in DELTA:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = torch.sigmoid(r(B, H, n))
        g = _delta_t(gen, n) if name == "gated_deltanet" else None
        return (q / math.sqrt(DH), k, v, beta, g), {}
    if name == "retnet":  # log γ_h, γ_h = 1 − 2^(−5−h), the layer's buffer
        g = torch.log1p(-(2.0 ** (-5.0 - torch.arange(H, dtype=torch.float64)))).float()
        return (q, k, v, g.view(1, H, 1, 1)), {"scale": 1 / math.sqrt(DH)}
    if name == "gla":  # log σ(·)/τ per key dimension, τ = 16
        return (q, k, v, F.logsigmoid(r(B, H, n, DH)) / 16), {"scale": 1 / math.sqrt(DH)}
    if name == "mamba2":  # C as q, B as k (d_state N), x·Δ as v (P)
        assert D_STATE == DH  # the shapes above: q, k (b, h, n, N), v (b, h, n, P)
        return (q, k, v, _delta_t(gen, n)[..., None]), {"scale": 1.0}
    raise ValueError(f"not a mixer: {name}")


def core_flops(name: str, n: int, chunk: int) -> int:
    """The core's matmul FLOPs at n and ``chunk``: its ``chunked_flops`` × b·h."""
    if name in DELTA:
        return B * H * delta_scan.chunked_flops(n, DH, DH, chunk)
    return B * H * gated_scan.chunked_flops(n, DH, DH, chunk, name == "gla")


def _chunked(name: str) -> Callable[..., Any]:
    return delta_scan.delta_chunked if name in DELTA else gated_scan.gated_chunked


def _reference(name: str) -> Callable[..., Any]:
    return delta_scan.delta_reference if name in DELTA else gated_scan.gated_reference


def _layer(name: str, max_seq_len: int) -> nn.Module:
    torch.manual_seed(0)
    return attnbench.create(name, d_model=D, n_heads=H, max_seq_len=max_seq_len).eval()


def _time(benchmark, fn: Callable[[], Any], rounds: int, warmup: int, **info: Any) -> None:
    """Record ``info`` and the threads, then time ``fn()`` once a round under inference_mode."""
    benchmark.extra_info.update({**info, "threads": torch.get_num_threads()})
    with torch.inference_mode():
        benchmark.pedantic(fn, rounds=rounds, warmup_rounds=warmup, iterations=1)


# -- the benchmarks ----------------------------------------------------------------------------


def test_matmul_rate(benchmark) -> None:
    """fp32 GEMM at the layer's own shape (n × d @ d × d): the rate the floors divide by."""
    n = n_of(benchmark)
    x, w = torch.randn(n, D), torch.randn(D, D)
    rate = cpu_matmul_rate()  # the median's rate, as read: what a busy reading left it
    _time(
        benchmark,
        lambda: x @ w,
        5 * ROUNDS,  # cheap: more rounds, as test_forward_speed.py's
        WARMUP,
        role="matmul",
        flops=2 * n * D * D,
        gemm_1024_flops_per_s=rate.now,
        gemm_1024_busy=rate.busy,
        load_avg=os.getloadavg(),
        shape=_shape(n),
    )


def test_matmul_rate_chunk(benchmark) -> None:
    """fp32 batched GEMM of a chunk's shape, b·h·n/64 products of 64 × 64 @ 64 × 64: the
    shape of the cores' matmuls, shown beside the floors' rate (not used for them)."""
    n = n_of(benchmark)
    batch = B * H * max(1, n // CHUNK)
    a, w = torch.randn(batch, CHUNK, DH), torch.randn(batch, DH, CHUNK)
    _time(
        benchmark,
        lambda: a @ w,
        5 * ROUNDS,
        WARMUP,
        role="matmul-chunk",
        flops=2 * batch * CHUNK * DH * CHUNK,
        load_avg=os.getloadavg(),
        shape=_shape(n),
    )


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("name", MIXERS)
def test_core(benchmark, name: str, chunk: int) -> None:
    n = n_of(benchmark)
    args, kwargs = core_inputs(name, n)
    fn = _chunked(name)
    with torch.inference_mode():
        counted = count_flops(fn, *args, chunk=chunk, **kwargs)
    _time(
        benchmark,
        lambda: fn(*args, chunk=chunk, **kwargs),
        ROUNDS,
        WARMUP,
        role="core",
        mechanism=name,
        chunk=chunk,
        n=n,
        flops=core_flops(name, n, chunk),
        flops_counted=counted,
        load_avg=os.getloadavg(),
        shape=_shape(n),
    )


@pytest.mark.parametrize("name", MIXERS)
def test_reference(benchmark, name: str) -> None:
    n = ref_n_of(benchmark)
    args, kwargs = core_inputs(name, n)
    fn = _reference(name)
    _time(
        benchmark,
        lambda: fn(*args, **kwargs),
        REF_ROUNDS,
        REF_WARMUP,
        role="reference",
        mechanism=name,
        n=n,
        load_avg=os.getloadavg(),
        shape=_shape(n),
    )


@pytest.mark.parametrize("name", MIXERS)
def test_layer(benchmark, name: str) -> None:
    n = n_of(benchmark)
    layer = _layer(name, n)
    x = torch.randn(B, n, D, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        counted = count_flops(layer, x)
    _time(
        benchmark,
        lambda: layer(x),
        ROUNDS,
        WARMUP,
        role="layer",
        mechanism=name,
        chunk=layer.cfg.chunk,
        n=n,
        flops=layer.flops(B, n),
        flops_counted=counted,
        load_avg=os.getloadavg(),
        shape=_shape(n),
    )


@pytest.mark.parametrize("caches", CACHES)
@pytest.mark.parametrize("name", MIXERS)
def test_decode_step(benchmark, name: str, caches: str) -> None:
    n = n_of(benchmark)
    layer = _layer(name, n + 1)
    with torch.inference_mode():
        state = layer.new_state(B, n + 1, torch.float32, "cpu")
        random_fill([state], n)
    token = [torch.randn(B, 1, D, generator=torch.Generator().manual_seed(0))]
    evict = torch.ones(COPY_BYTES // 4) if caches == "flushed" else None

    def step() -> None:
        token[0] = layer.extend(token[0], state)  # the output is the next step's input

    def flush() -> None:  # untimed, before each round: read past the last-level cache
        evict.sum()

    floor = memory_floor(B * layer.state_bytes(n, 4), module_bytes(layer))
    benchmark.extra_info.update(
        role="decode",
        mechanism=name,
        caches=caches,
        n=n,
        step_flops=layer.step_flops(B, n),
        **floor,
        shape=_shape(n),
    )
    with torch.inference_mode():
        benchmark.pedantic(
            step,
            setup=None if evict is None else flush,
            rounds=STEP_ROUNDS,
            warmup_rounds=STEP_WARMUP,
            iterations=1,
        )
    assert torch.isfinite(token[0]).all()  # the steps fed on themselves stayed numbers


@pytest.mark.parametrize("name", MIXERS)
def test_decode_linears(benchmark, name: str) -> None:
    """The decode step's weight reads alone: every ``nn.Linear`` of the layer applied once to
    one token (its own input width), one after another, after the same 256 MiB read as a
    ``flushed`` step. What a step costs with nothing but its projections: the part of the
    step's time that reading the weights takes through torch's GEMV here."""
    layer = _layer(name, n_of(benchmark) + 1)
    linears = [m for m in layer.modules() if isinstance(m, nn.Linear)]
    inputs = [torch.randn(B, 1, m.in_features) for m in linears]
    evict = torch.ones(COPY_BYTES // 4)

    def project() -> None:
        for m, x in zip(linears, inputs, strict=True):
            F.linear(x, m.weight, m.bias)

    def flush() -> None:  # untimed: pytest-benchmark reads a setup's result as arguments
        evict.sum()

    benchmark.extra_info.update(
        role="decode-linears",
        mechanism=name,
        linears=len(linears),
        weight_bytes=sum(m.weight.numel() * m.weight.element_size() for m in linears),
    )
    with torch.inference_mode():
        benchmark.pedantic(
            project,
            setup=flush,
            rounds=STEP_ROUNDS,
            warmup_rounds=STEP_WARMUP,
            iterations=1,
        )


# -- the figures -------------------------------------------------------------------------------


def _rate(rows: list[tuple[dict, dict]], role: str) -> tuple[float, dict] | None:
    """The run's fp32 matmul rate of ``role`` (its FLOPs ÷ its median) and its extra_info."""
    got = next(((s, e) for s, e in rows if e["role"] == role), None)
    return None if got is None else (got[1]["flops"] / got[0]["median"], got[1])


def summary(data: dict) -> str:
    """The Markdown tables of a pytest-benchmark JSON of this file: the chunked forms against
    their matmul floors and references, the decode steps against their memory floors, and
    the chunk-size curve. Every ratio is of medians of the same run."""
    rows = [(b["stats"], b["extra_info"]) for b in data["benchmarks"]]
    rate, mm = _rate(rows, "matmul")
    chunk_rate = _rate(rows, "matmul-chunk")
    # (role, mechanism, chunk or caches) -> (stats, extra_info)
    by = {
        (e["role"], e["mechanism"], e.get("chunk", e.get("caches"))): (s, e)
        for s, e in rows
        if "mechanism" in e
    }
    names = [m for m in MIXERS if any(k[1] == m for k in by)]
    decode = [by[("decode", m, c)] for m in names for c in CACHES if ("decode", m, c) in by]
    loads = [e["load_avg"][0] for _, e in rows if "load_avg" in e]
    bandwidth = f"{decode[0][1]['copy_bytes_per_s'] / 1e9:.1f} GB/s" if decode else "not run"
    small = "" if chunk_rate is None else f"; 64 × 64 blocks {chunk_rate[0] / 1e9:.1f}"
    out = [
        f"{mm['shape']}, {mm['threads']} threads; fp32 matmul rate {rate / 1e9:.1f} GFLOP/s "
        f"(n × d @ d × d, the floors'; 1024² GEMM {mm['gemm_1024_flops_per_s'] / 1e9:.1f}"
        f"{small}); copy bandwidth {bandwidth} (read + write); load average (1 min) "
        f"{min(loads):.2f}–{max(loads):.2f}; machine: "
        f"{data['machine_info'].get('cpu', {}).get('brand_raw', '?')}",
        "",
        f"Chunked forward (chunk {CHUNK}) against its matmul floor and its token-by-token "
        "reference",
        "",
        "| mechanism | timed | median ms | IQR ms | GFLOP | floor ms | median / floor "
        "| median / block floor | reference ms | reference / this |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for m in names:
        for role in ("core", "layer"):
            if (role, m, CHUNK) not in by:
                continue
            s, e = by[(role, m, CHUNK)]
            floor = e["flops"] / rate
            # the same FLOPs at the rate of the cores' own matmul shape (64 × 64 blocks)
            block = "-"
            if role == "core" and chunk_rate is not None:
                block = f"{s['median'] * chunk_rate[0] / e['flops']:.2f}"
            against = "- | -"
            if role == "core" and ("reference", m, None) in by:
                r_s, r_e = by[("reference", m, None)]
                # per token: the plain ratio of medians where the two n agree
                speedup = (r_s["median"] / r_e["n"]) / (s["median"] / e["n"])
                against = f"{r_s['median'] * 1e3:.1f} | {speedup:.1f}"
                if r_e["n"] != e["n"]:
                    notes.append(f"{m}'s reference timed at n = {r_e['n']}, compared per token")
            out.append(
                f"| {m} | {role} | {s['median'] * 1e3:.1f} | {s['iqr'] * 1e3:.1f} | "
                f"{e['flops'] / 1e9:.2f} | {floor * 1e3:.1f} | {s['median'] / floor:.2f} | "
                f"{block} | {against} |"
            )
            if e["flops_counted"] != e["flops"]:
                notes.append(
                    f"{m} {role}: FlopCounterMode counted {e['flops_counted']}, the formula "
                    f"{e['flops']}"
                )
    out += ["", *(f"- {note}" for note in notes)] if notes else []

    if decode:
        out += [
            "",
            "One decode step of the layer (extend by one token) against its memory floor",
            "",
            "| mechanism | caches | median µs | IQR µs | state KB | weights MB | floor µs "
            "| median / floor | achieved GB/s | its linears alone µs |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s, e in decode:
            alone = by.get(("decode-linears", e["mechanism"], None))
            linears = (
                "-"
                if alone is None or e["caches"] != "flushed"
                else (f"{alone[0]['median'] * 1e6:.0f}")
            )
            out.append(
                f"| {e['mechanism']} | {e['caches']} | {s['median'] * 1e6:.0f} | "
                f"{s['iqr'] * 1e6:.0f} | {e['state_bytes'] / 1e3:.1f} | "
                f"{e['weight_bytes'] / 1e6:.2f} | {e['floor_s'] * 1e6:.0f} | "
                f"{s['median'] / e['floor_s']:.2f} | {e['read_bytes'] / s['median'] / 1e9:.1f} | "
                f"{linears} |"
            )

    chunks = sorted({k[2] for k in by if k[0] == "core"})
    if chunks:
        out += [
            "",
            "The chunked core at each chunk size: median ms (median / matmul floor)",
            "",
            "| mechanism | " + " | ".join(f"chunk {c}" for c in chunks) + " | fastest |",
            "|---|" + "---:|" * (len(chunks) + 1),
        ]
        for m in names:
            cells, best = [], None
            for c in chunks:
                if ("core", m, c) not in by:
                    cells.append("-")
                    continue
                s, e = by[("core", m, c)]
                cells.append(f"{s['median'] * 1e3:.1f} ({s['median'] * rate / e['flops']:.2f})")
                if best is None or s["median"] < best[1]:
                    best = (c, s["median"])
            out.append(f"| {m} | " + " | ".join(cells) + f" | {best[0] if best else '-'} |")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summary(json.load(f)))
