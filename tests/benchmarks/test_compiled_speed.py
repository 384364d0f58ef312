r"""Eager against compiled, every mechanism (pytest-benchmark).

The shape of test_forward_speed.py: n = 4096, d_model 768, 12 heads, the budget (Linformer's k,
Performer's features, local's and flex's window, ...) 256, batch 1, fp32 on the CPU. Each
mechanism's attention layer is timed eager and ``torch.compile``-d (compiled, and run until
compiled, before the first warm-up round: no round pays for the compiler), its forward and,
where it has a backward here, its forward and backward (``out.pow(2).mean().backward()``, a
fresh leaf input each round). ``flex`` is FlexAttention with the window pattern (the band of
``local``); it compiles its own kernel even in its "eager" case, and has no backward on a
CPU. Each benchmark records its FLOPs (FlopCounterMode on the eager layer; flex's from its
block-sparse formula, the dense count beside it) and the run the fp32 matmul rate, so that
``scripts/bench_summary.py`` puts each median against its floor (FLOPs / rate) and each
compiled median against its eager one. No speed is asserted: the figures go to
docs/compile.md.

    pytest tests/benchmarks/test_compiled_speed.py --benchmark-enable --benchmark-only \
        --benchmark-json compiled.json -p no:randomly
    python scripts/bench_summary.py compiled.json

Without ``--benchmark-enable`` (the default test run) each case runs once, untimed, at n = 256,
and only a few mechanisms compiled (:data:`SMOKE`): compiling all of them, forward and
backward, costs minutes of the test run for no figure (tests/test_compile.py holds compiled
cells to the eager ones).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import attnbench
from attnbench.measure.flops import count_flops

D, H, K, B = 768, 12, 256, 1
ROUNDS, WARMUP = 5, 1
SMOKE = ("vanilla", "local", "flex")  # compiled in the default (untimed) test run


def _compiled_here(benchmark, name: str, compiled: bool) -> None:
    if compiled and benchmark.disabled and name not in SMOKE:
        pytest.skip("compiled with --benchmark-enable only (the untimed run compiles SMOKE)")


def _n(benchmark) -> int:
    return 256 if benchmark.disabled else 4096


def _cases() -> list[tuple[str, dict]]:
    cases = []
    for name in attnbench.names():
        info = attnbench.info(name)
        if info.unavailable is not None or "cpu" not in info.devices:
            continue  # xformers without CUDA: info() says why
        params = {info.budget: K} if info.budget else {}
        if name == "flex":
            params["pattern"] = "window"
        cases.append((name, params))
    return cases


def _id(value: object) -> str:
    return value if isinstance(value, str) else ""


def _layer(name: str, params: dict, n: int, train: bool) -> nn.Module:
    torch.manual_seed(0)
    return attnbench.create(name, d_model=D, n_heads=H, max_seq_len=n, **params).train(train)


def _input(n: int, grad: bool) -> torch.Tensor:
    x = torch.randn(B, n, D, generator=torch.Generator().manual_seed(0))
    return x.requires_grad_(grad)


def _flops(name: str, m: nn.Module, fn: Callable, x: torch.Tensor, n: int) -> dict:
    if attnbench.info(name).compiles:  # the kernel is compiled: the counter cannot see it
        return {"flops": m.flops(B, n), "flops_dense": m.dense_flops(B, n)}
    return {"flops": count_flops(fn, x)}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(
    ("name", "params"), _cases(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_forward(benchmark, name: str, params: dict, compiled: bool) -> None:
    _compiled_here(benchmark, name, compiled)
    n = _n(benchmark)
    m, x = _layer(name, params, n, train=False), _input(n, grad=False)
    with torch.inference_mode():
        info = _flops(name, m, m, x, n)
        fn = torch.compile(m, dynamic=False) if compiled else m
        fn(x)  # compiled (and flex's block mask built) before any round
        benchmark.extra_info.update(
            role="compiled" if compiled else "eager",
            pair=f"{name} forward",
            threads=torch.get_num_threads(),
            shape=f"n={n} d_model={D} heads={H} budget={K} batch={B} fp32 cpu",
            **info,
        )
        benchmark.pedantic(fn, args=(x,), rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(
    ("name", "params"), _cases(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_forward_backward(benchmark, name: str, params: dict, compiled: bool) -> None:
    _compiled_here(benchmark, name, compiled)
    info = attnbench.info(name)
    if info.no_cpu_backward or info.cannot_train:
        pytest.skip(info.no_cpu_backward or info.cannot_train)
    n = _n(benchmark)
    m = _layer(name, params, n, train=True)
    fn = torch.compile(m, dynamic=False) if compiled else m

    def step() -> None:
        fn(_input(n, grad=True)).pow(2).mean().backward()
        m.zero_grad(set_to_none=True)

    step()  # compiled, forward and backward, before any round
    benchmark.extra_info.update(
        role="compiled" if compiled else "eager",
        pair=f"{name} forward+backward",
        threads=torch.get_num_threads(),
        shape=f"n={n} d_model={D} heads={H} budget={K} batch={B} fp32 cpu",
        flops=count_flops(lambda x: m(x).pow(2).mean().backward(), _input(n, grad=True)),
    )
    benchmark.pedantic(step, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)


def test_matmul_rate(benchmark) -> None:
    """fp32 GEMM at the layer's own shape (n × d @ d × d): the rate the floor divides by."""
    n = _n(benchmark)
    x, w = _input(n, grad=False), torch.randn(D, D)
    benchmark.extra_info.update(
        role="matmul",
        threads=torch.get_num_threads(),
        flops=2 * n * D * D,
        shape=f"n={n} d_model={D} heads={H} budget={K} batch={B} fp32 cpu",
    )
    benchmark.pedantic(lambda: x[0] @ w, rounds=5 * ROUNDS, warmup_rounds=WARMUP, iterations=1)
