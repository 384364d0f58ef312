r"""linear beside linear-attention-transformer, and the causal Performer's chunked prefix sums
beside the performer-pytorch path they replaced (pytest-benchmark).

The shape of test_forward_speed.py: n = 4096, d_model 768, 12 heads, batch 1, fp32 on the CPU,
a forward under inference_mode. Each benchmark also records its peak bytes above what was live
before it (``attnbench.measure.memory.profiled_peak``, the CPU profiler). No speed is asserted.

* ``linear`` against linear-attention-transformer's ``SelfAttention`` (its closest layer:
  global linear attention with q/k/v/out projections, no local heads), non-causal and causal.
  Its feature maps differ from elu + 1: non-causal it is Shen et al.'s efficient attention,
  softmax(q) over features times d_h^(-1/2) and softmax(k) over the sequence, with no
  normaliser; causal it takes exp(k) and cumulative sums over every position
  (``blindspot_size=1``, its default and its only exact causal mode), which hold n × d_h × d_h
  numbers. Same shapes and FLOPs order, so the times compare implementations.
* the causal Performer (nb_features 256), ours against ``causal_linear_attention_noncuda``
  called directly on the same features.

    pytest tests/benchmarks/test_peer_linear.py --benchmark-enable --benchmark-only \
        --benchmark-json bench.json
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import attnbench
from attnbench.measure.memory import profiled_peak
from tests.benchmarks.test_forward_speed import D, H, _run, _x, n_of


def _bench(benchmark, fn: Callable[[torch.Tensor], torch.Tensor], role: str) -> None:
    """Time ``fn`` as test_forward_speed does, then record its peak bytes."""
    _run(benchmark, fn, role=role)
    x = _x(n_of(benchmark))
    with torch.inference_mode():
        benchmark.extra_info["peak_bytes"] = profiled_peak(lambda: fn(x))


@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
def test_linear_ours(benchmark, causal: bool) -> None:
    torch.manual_seed(0)
    n = n_of(benchmark)
    m = attnbench.create("linear", d_model=D, n_heads=H, max_seq_len=n, causal=causal).eval()
    _bench(benchmark, m, role="ours")


@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
def test_peer_linear_attention_transformer(benchmark, causal: bool) -> None:
    from linear_attention_transformer.linear_attention_transformer import SelfAttention

    torch.manual_seed(0)
    m = SelfAttention(D, H, causal=causal, blindspot_size=1).eval()
    _bench(benchmark, m, role="peer")


def _performer(n: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return attnbench.create(
        "performer", d_model=D, n_heads=H, max_seq_len=n, nb_features=256, causal=True
    ).eval()


def test_performer_causal_chunked(benchmark) -> None:
    _bench(benchmark, _performer(n_of(benchmark)), role="ours")


def test_performer_causal_fallback(benchmark) -> None:
    """The path performer.py ran before: the same projections and features, then
    performer-pytorch's prefix sums (eps=0 as performer.py passed it)."""
    from performer_pytorch.performer_pytorch import causal_linear_attention_noncuda

    m = _performer(n_of(benchmark))

    def fallback(x: torch.Tensor) -> torch.Tensor:
        q, k, v = m.qkv_heads(x)
        q_f, k_f = m.features(q.float(), k.float())
        out = causal_linear_attention_noncuda(q_f, k_f, v.float(), eps=0.0)
        return m.out_proj(m.merge_heads(out))

    _bench(benchmark, fallback, role="peer")
