r"""Training-step speed of our Linformer beside the public Linformer packages (pytest-benchmark).

The shape of test_forward_speed.py: n = 4096 (512 in the untimed default test run), d_model
768, 12 heads, k = 256, batch 1, fp32 on the CPU, but each round times ONE TRAINING STEP of
one attention layer in train mode: forward, ``loss = out.pow(2).mean()``, ``loss.backward()``;
no optimizer. The input is a fresh leaf with ``requires_grad=True`` every round (as if it came
from an embedding), and every gradient is set to None before each round (outside the timing),
so no round pays for accumulating into the last one's ``.grad``. Dropout is 0 in every layer
timed (the peers' own dropout included), so all of them do the same work.

Beside the timings, each benchmark records the FLOPs of one step, forward and backward,
counted by ``torch.utils.flop_counter.FlopCounterMode`` (with attnbench.measure.flops's formula
for the CPU flash kernel, and the same for its backward), and the run records the fp32 matmul
rate, so that ``scripts/bench_summary.py`` can put every median against its matmul floor
(FLOPs / rate) measured in the same run. No speed is asserted here: figures go to docs/speed.md.

    pytest tests/benchmarks/test_train_speed.py --benchmark-enable --benchmark-only \
        --benchmark-json train.json -p no:randomly
    python scripts/bench_summary.py train.json
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils import flop_counter

import attnbench
from attnbench.measure.flops import count_flops  # also: the CPU flash forward's formula
from tests.benchmarks.test_forward_speed import n_of  # n = 512 in the untimed run

N, D, H, K, B = 4096, 768, 12, 256, 1
ROUNDS, WARMUP = 7, 2

_aten = torch.ops.aten
_CPU_FLASH_BACKWARD = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def _sdpa_backward_flops(grad_out, query, key, value, *_, **__) -> int:
    """The CUDA flash backward's formula: the scores recomputed, then dV, dP, dQ and dK."""
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


# the counter knows the CUDA flash backward, not the CPU kernel sdpa's backward runs on the CPU
_MAPPING = (
    {_CPU_FLASH_BACKWARD: _sdpa_backward_flops}
    if _CPU_FLASH_BACKWARD is not None and _CPU_FLASH_BACKWARD not in flop_counter.flop_registry
    else {}
)


def _x(n: int = N) -> torch.Tensor:
    return torch.randn(B, n, D, generator=torch.Generator().manual_seed(0))


def _step(m: nn.Module, x: torch.Tensor) -> None:
    """One training step without the optimizer: forward, the loss, backward."""
    loss = m(x).pow(2).mean()
    loss.backward()


def _count_step_flops(m: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of forward and backward of one step (multiply and add counted separately)."""
    with flop_counter.FlopCounterMode(display=False, custom_mapping=_MAPPING) as counter:
        _step(m, x)
    return counter.get_total_flops()


def _run(benchmark, m: nn.Module, role: str) -> None:
    m.train()
    dropouts = [mod.p for mod in m.modules() if isinstance(mod, nn.Dropout)]
    assert all(p == 0 for p in dropouts), f"dropout must be 0 for a fair comparison: {dropouts}"
    n = n_of(benchmark)
    base = _x(n)

    def fresh() -> tuple[tuple[torch.Tensor], dict]:
        m.zero_grad(set_to_none=True)  # no accumulation into the last round's grads
        return (base.clone().requires_grad_(True),), {}  # a new leaf, its .grad None

    benchmark.extra_info.update(
        role=role,
        flops=_count_step_flops(m, fresh()[0][0]),
        threads=torch.get_num_threads(),
        shape=f"one training step (forward + backward), n={n} d_model={D} heads={H} k={K} "
        f"batch={B} fp32 cpu",
    )
    benchmark.pedantic(
        lambda x: _step(m, x), setup=fresh, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1
    )


def _ours() -> list[dict]:
    cases = [{"k": K, "sharing": s} for s in ("none", "headwise", "kv")]
    # the paper's eager n × k softmax: the speed-up from FLOPs alone, no fused kernel
    cases.append({"k": K, "sharing": "kv", "kernel": "eager"})
    return cases


@pytest.mark.parametrize("params", _ours(), ids=lambda v: "-".join(map(str, v.values())))
def test_attnbench_linformer(benchmark, params: dict) -> None:
    torch.manual_seed(0)
    m = attnbench.create("linformer", d_model=D, n_heads=H, max_seq_len=n_of(benchmark), **params)
    _run(benchmark, m, role="ours")


@pytest.mark.parametrize("share_kv", [False, True], ids=["headwise", "kv"])
def test_peer_lucidrains_linformer(benchmark, share_kv: bool) -> None:
    from linformer import LinformerSelfAttention

    torch.manual_seed(0)
    m = LinformerSelfAttention(D, n_of(benchmark), k=K, heads=H, share_kv=share_kv, dropout=0.0)
    _run(benchmark, m, role="peer")


def test_peer_linformer_pytorch(benchmark) -> None:
    from linformer_pytorch.linformer_pytorch import MHAttention

    torch.manual_seed(0)
    # dropout 0.0 (the sixth argument), checkpoint level C0: no recomputation in backward
    m = MHAttention(
        n_of(benchmark), D // H, D, K, H, 0.0, "C0", "headwise", None, None, False, None
    )
    _run(benchmark, m, role="peer")


def test_matmul_rate(benchmark) -> None:
    """fp32 GEMM at the layer's own shape (n × d @ d × d): the rate the floor divides by.

    Forward only and without autograd, as in test_forward_speed.py: the plain GEMM rate.
    """
    w = torch.randn(D, D)
    n = n_of(benchmark)
    x = _x(n)

    def mm(x: torch.Tensor) -> torch.Tensor:
        return x[0] @ w

    with torch.inference_mode():
        benchmark.extra_info.update(
            role="matmul",
            flops=count_flops(mm, x),
            threads=torch.get_num_threads(),
            shape=f"n={n} d_model={D} fp32 cpu",
        )
        benchmark.pedantic(mm, args=(x,), rounds=5 * ROUNDS, warmup_rounds=WARMUP, iterations=1)
