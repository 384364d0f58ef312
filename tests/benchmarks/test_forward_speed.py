r"""Forward speed of every mechanism beside the public Linformer packages (pytest-benchmark).

One shape: n = 4096, d_model 768, 12 heads, k = 256, batch 1, fp32 on the CPU (without
``--benchmark-enable``, the default test run, each case runs once, untimed, at n = 512:
:func:`n_of`). Beside the timings, each benchmark records the FLOPs of one forward counted by
``torch.utils.flop_counter.FlopCounterMode`` (via attnbench.measure.flops, which also sees the
CPU flash kernel) and the run records the fp32 matmul rate, so that
``scripts/bench_summary.py`` can put every median against its matmul floor (FLOPs / rate)
measured in the same run. No speed is asserted here: figures go to docs/speed.md.

    pytest tests/benchmarks/test_forward_speed.py --benchmark-enable --benchmark-only \
        --benchmark-json bench.json
    python scripts/bench_summary.py bench.json
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import attnbench
from attnbench.measure.flops import count_flops

N, D, H, K, B = 4096, 768, 12, 256, 1
ROUNDS, WARMUP = 7, 2
SMOKE_N = 512  # the untimed run's n: k = 256 fits, and reformer-pytorch's 2 x 256 divides it


def n_of(benchmark) -> int:
    """The n a case runs at: :data:`N` when timed (``--benchmark-enable``), else
    :data:`SMOKE_N`: the default test run runs each case once, untimed, to show it runs,
    and at n = 4096 that costs minutes of the suite for no figure (as
    test_compiled_speed.py does)."""
    return N if benchmark.enabled else SMOKE_N


def _x(n: int = N) -> torch.Tensor:
    return torch.randn(B, n, D, generator=torch.Generator().manual_seed(0))


def _run(
    benchmark,
    fn: Callable[[torch.Tensor], torch.Tensor],
    role: str,
    rounds: int = ROUNDS,
    flops: int | None = None,
) -> None:
    n = n_of(benchmark)
    x = _x(n)
    with torch.inference_mode():
        benchmark.extra_info.update(
            role=role,
            flops=count_flops(fn, x) if flops is None else flops,
            threads=torch.get_num_threads(),
            shape=f"n={n} d_model={D} heads={H} k={K} batch={B} fp32 cpu",
        )
        benchmark.pedantic(fn, args=(x,), rounds=rounds, warmup_rounds=WARMUP, iterations=1)


def _ours() -> list[tuple[str, dict]]:
    cases = []
    for name in attnbench.names():
        info = attnbench.info(name)
        if info.unavailable is not None or "cpu" not in info.devices:
            continue  # e.g. xformers without CUDA: info() says why
        if name == "linformer":
            cases += [(name, {"k": K, "sharing": s}) for s in ("none", "headwise", "kv")]
            # the paper's eager n × k softmax: the speed-up from FLOPs alone, no fused kernel
            cases.append((name, {"k": K, "sharing": "kv", "kernel": "eager"}))
        elif name == "flex":  # local's band, the comparison flex is here for
            cases.append((name, {"pattern": "window", "window": K}))
        else:
            cases.append((name, {info.budget: K} if info.budget else {}))
    return cases


@pytest.mark.parametrize(
    ("name", "params"),
    _ours(),
    ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())),
)
def test_attnbench(benchmark, name: str, params: dict) -> None:
    torch.manual_seed(0)
    n = n_of(benchmark)
    m = attnbench.create(name, d_model=D, n_heads=H, max_seq_len=n, **params).eval()
    # a compiled kernel cannot run under the FLOP counter (a dispatch mode): its own count,
    # the block-sparse one, stands in
    flops = m.flops(B, n) if attnbench.info(name).compiles else None
    _run(benchmark, m, role="ours", flops=flops)


@pytest.mark.parametrize("share_kv", [False, True], ids=["headwise", "kv"])
def test_peer_lucidrains_linformer(benchmark, share_kv: bool) -> None:
    from linformer import LinformerSelfAttention

    m = LinformerSelfAttention(D, n_of(benchmark), k=K, heads=H, share_kv=share_kv).eval()
    _run(benchmark, m, role="peer")


def test_peer_linformer_pytorch(benchmark) -> None:
    from linformer_pytorch.linformer_pytorch import MHAttention

    n = n_of(benchmark)
    m = MHAttention(n, D // H, D, K, H, 0.0, "C0", "headwise", None, None, False, None).eval()
    _run(benchmark, m, role="peer")


def test_peer_torch_multihead_attention(benchmark) -> None:
    m = nn.MultiheadAttention(D, H, batch_first=True).eval()
    _run(benchmark, lambda x: m(x, x, x, need_weights=False)[0], role="reference")


def test_matmul_rate(benchmark) -> None:
    """fp32 GEMM at the layer's own shape (n × d @ d × d): the rate the floor divides by."""
    w = torch.randn(D, D)
    _run(benchmark, lambda x: x[0] @ w, role="matmul", rounds=5 * ROUNDS)  # cheap: more rounds
