"""Turn a pytest-benchmark JSON of tests/benchmarks into the table quoted in docs/speed.md.

Pure: reads the JSON, prints Markdown. Ratios are of medians taken in the same run; the floor
of a mechanism is its counted FLOPs divided by the fp32 matmul rate measured in that run.
"""

from __future__ import annotations

import json
import sys


def summarize(data: dict) -> str:
    rows = [
        (b["name"].removeprefix("test_"), b["stats"]["median"], b["extra_info"])
        for b in data["benchmarks"]
    ]
    mm = next((med, e) for n, med, e in rows if e["role"] == "matmul")
    rate = mm[1]["flops"] / mm[0]
    peers = [med for _, med, e in rows if e["role"] == "peer"]
    fastest_peer = min(peers) if peers else float("nan")
    e0 = rows[0][2]
    out = [
        f"{e0['shape']}, {e0['threads']} threads; fp32 matmul rate {rate / 1e9:.1f} GFLOP/s; "
        f"machine: {data['machine_info'].get('cpu', {}).get('brand_raw', '?')}",
        "",
        "| benchmark | role | median ms | GFLOP | floor ms | median / floor | "
        "fastest peer / this |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, med, e in sorted(rows, key=lambda r: r[1]):
        if e["role"] == "matmul":
            continue
        if e["flops"]:
            floor = e["flops"] / rate
            counted = f"{e['flops'] / 1e9:.2f} | {floor * 1e3:.1f} | {med / floor:.2f}"
        else:  # a fused op FlopCounterMode cannot see (nn.MultiheadAttention's fast path)
            counted = "not counted | - | -"
        out.append(
            f"| {name} | {e['role']} | {med * 1e3:.1f} | {counted} | {fastest_peer / med:.2f} |"
        )
    pairs = _pairs(rows, rate)
    return "\n".join(out + (["", *pairs] if pairs else []))


def _pairs(rows: list[tuple[str, float, dict]], rate: float) -> list[str]:
    """Eager beside compiled (tests/benchmarks/test_compiled_speed.py): each ``pair`` once,
    the speed-up from compiling (eager ÷ compiled median, same run) and each against its
    floor."""
    by: dict[str, dict[str, tuple[float, dict]]] = {}
    for _, med, e in rows:
        if e["role"] in ("eager", "compiled") and "pair" in e:
            by.setdefault(e["pair"], {})[e["role"]] = (med, e)
    if not by:
        return []
    out = [
        "Eager against compiled, same run",
        "",
        "| mechanism, work | eager ms | compiled ms | eager ÷ compiled | eager / floor | "
        "compiled / floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for pair, got in sorted(by.items()):
        if len(got) < 2:
            continue
        (te, e), (tc, _) = got["eager"], got["compiled"]
        floor = e["flops"] / rate
        out.append(
            f"| {pair} | {te * 1e3:.1f} | {tc * 1e3:.1f} | {te / tc:.2f} | {te / floor:.2f} | "
            f"{tc / floor:.2f} |"
        )
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summarize(json.load(f)))
