r"""A packed batch does the work of its real tokens only (#34): one layer, causal, fp32 on the
CPU, d_model 768, 12 heads, over 16384 real tokens drawn lognormal around 1024 (seed 0,
``attnbench.lengths.draw``, each at most 16384), timed with pytest-benchmark.

* ``alone``: each document through the layer by itself, one after another: the floor, the
  work of the real tokens and nothing else;
* ``packed``: the documents end to end in one row (``layer(x, packing=...)``);
* ``padded``: every document padded to the longest, with the key padding mask.

For sdpa, linear and local. The summary (``python -m tests.benchmarks.test_packed_floor
JSON``) gives packed ÷ alone (the target: within 1.2× for sdpa), padded ÷ packed, and beside
it the padded layout's wasted FLOP share from the formulas (1 − Σ flops(1, l) ÷ flops(D,
max)). Without ``--benchmark-enable`` each case runs once on a short draw (a smoke run).

    pytest tests/benchmarks/test_packed_floor.py --benchmark-enable --benchmark-only \
        --benchmark-json results/benchmarks/packed-cpu.json
    python -m tests.benchmarks.test_packed_floor results/benchmarks/packed-cpu.json \
        > results/benchmarks/packed-cpu.md
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

import attnbench
from attnbench import lengths
from attnbench.attention.packing import Packing

D, H, TOKENS, SMOKE_TOKENS, MEAN = 768, 12, 16384, 512, 1024
MECHANISMS = ("sdpa", "linear", "local")
LAYOUTS = ("alone", "packed", "padded")
ROUNDS, WARMUP = 5, 1


def draw(benchmark) -> tuple[int, ...]:
    tokens = TOKENS if benchmark.enabled else SMOKE_TOKENS
    mean = MEAN if benchmark.enabled else 64
    return lengths.draw("lognormal", total_tokens=tokens, seed=0, max_len=tokens,
                        length_mean=mean)  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", MECHANISMS)
def test_layout(benchmark, name: str, layout: str) -> None:
    docs = draw(benchmark)
    torch.manual_seed(0)
    layer = attnbench.create(name, d_model=D, n_heads=H, max_seq_len=max(sum(docs), 2),
                             causal=True).eval()  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, sum(docs), D, generator=gen)  # every document's tokens, end to end
    starts = [0, *lengths.cu_seqlens(docs)[1:-1]]
    if layout == "padded":
        longest = max(docs)
        xp = torch.zeros(len(docs), longest, D)
        for i, (s, n) in enumerate(zip(starts, docs, strict=True)):
            xp[i, :n] = x[0, s : s + n]
        mask = torch.arange(longest) >= torch.tensor(docs)[:, None]  # True = padding

        def step() -> object:
            return layer(xp, mask)
    elif layout == "packed":
        packing = Packing.of([docs])

        def step() -> object:
            return layer(x, packing=packing)
    else:

        def step() -> object:
            return [layer(x[:, s : s + n]) for s, n in zip(starts, docs, strict=True)]

    flops = {
        "alone": sum(layer.flops(1, n) for n in docs),
        "packed": layer.packed_flops(Packing.of([docs])),
        "padded": layer.flops(len(docs), max(docs)),
    }[layout]
    benchmark.extra_info.update(
        mechanism=name, layout=layout, documents=len(docs), real_tokens=sum(docs),
        longest=max(docs), flops=flops, real_flops=sum(layer.flops(1, n) for n in docs),
        threads=torch.get_num_threads(),
    )  # fmt: skip
    with torch.inference_mode():
        benchmark.pedantic(step, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)


def summary(data: dict) -> str:
    """The Markdown table of a pytest-benchmark JSON of this file: per mechanism the three
    medians, packed ÷ alone, padded ÷ packed and the padded layout's wasted FLOP share."""
    by = {(b["extra_info"]["mechanism"], b["extra_info"]["layout"]): b for b in data["benchmarks"]}
    first = data["benchmarks"][0]["extra_info"]
    out = [
        f"one layer, causal, fp32, d_model {D}, {H} heads, {first['threads']} threads; "
        f"{first['documents']} documents, {first['real_tokens']} real tokens drawn lognormal "
        f"around {MEAN} (seed 0), the longest {first['longest']}; machine: "
        f"{data['machine_info'].get('cpu', {}).get('brand_raw', '?')}",
        "",
        "Each document alone, packed and padded: medians of one layer's forward",
        "",
        "| mechanism | alone ms | packed ms | padded ms | packed / alone | padded / packed "
        "| padded wasted FLOPs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in MECHANISMS:
        if not all((m, x) in by for x in LAYOUTS):
            continue
        t = {x: by[(m, x)]["stats"]["median"] for x in LAYOUTS}
        pad = by[(m, "padded")]["extra_info"]
        wasted = 1 - pad["real_flops"] / pad["flops"]
        out.append(
            f"| {m} | {t['alone'] * 1e3:.1f} | {t['packed'] * 1e3:.1f} | "
            f"{t['padded'] * 1e3:.1f} | {t['packed'] / t['alone']:.2f} | "
            f"{t['padded'] / t['packed']:.2f} | {100 * wasted:.0f} % |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summary(json.load(f)))
