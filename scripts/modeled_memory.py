"""The memory half of Table 3 from the memory model: max batch on a 16 GB V100, fp16.

For the Transformer (vanilla) and Linformer (layerwise; k = 128, 256; both the paper's eager
n × k softmax and our default fused one) at n = 512 ... 65536, the modeled max batch and the
memory ratio (Linformer max batch / Transformer max batch) beside the paper's. No GPU needed.

    python scripts/modeled_memory.py > results/modeled_memory_v100_fp16.md
"""

from __future__ import annotations

import csv
import sys
from importlib.resources import files

from attnbench.cell import Cell
from attnbench.runner import run_cell

NS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
KS = (128, 256)


def paper_memory_ratios() -> dict[tuple[int, int], float]:
    path = files("attnbench") / "data" / "linformer_table3.csv"  # the paper's, shipped
    with open(str(path)) as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {(int(r["n"]), int(r["k"])): float(r["memory_ratio"]) for r in rows}


def max_batch(attention: str, n: int, k: int | None = None, kernel: str | None = None) -> int:
    params = () if kernel is None else (("kernel", kernel), ("sharing", "layerwise"))
    row = run_cell(Cell(attention, n=n, k=k, params=params, model_only=True))
    if row.status not in ("ok", "oom"):
        raise RuntimeError(f"{attention} n={n} k={k}: {row.status}: {row.reason}")
    return row.max_batch


def main() -> int:
    paper = paper_memory_ratios()
    head = "| n | Transformer max b |"
    rule = "|---:|---:|"
    for kernel in ("eager", "sdpa"):
        for k in KS:
            head += f" Linformer k={k} ({kernel}) max b | ratio | paper |"
            rule += "---:|---:|---:|"
    print(
        "Modeled max batch on v100_16gb (16,160 MiB less 512 MiB overhead), fp16, 12-layer "
        "RoBERTa-base encoder, Linformer layerwise; ratio = Linformer / Transformer max batch."
        "\n"
    )
    print(head)
    print(rule)
    for n in NS:
        base = max_batch("vanilla", n)
        line = f"| {n} | {base if base else 'OOM at b=1'} |"
        for kernel in ("eager", "sdpa"):
            for k in KS:
                b = max_batch("linformer", n, k, kernel)
                ratio = f"{b / base:.1f}" if base else "-"
                line += f" {b} | {ratio} | {paper.get((n, k), '-')} |"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
