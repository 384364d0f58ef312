"""What the allocator's replay costs the max-batch search: over one run's cells that fit,
the allocation-only search (``solve_affine`` on the memory model) and then the replayed
search from its answer (``MemoryModel.replayed_max_batch``), each timed per cell in this one
process, so the ratio holds on a busy machine too.

    python scripts/replay_cost.py [RUN_DIR]   # default: the reference run of +sweep=table3
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from attnbench.cell_key import cell_of
from attnbench.measure.search import solve_affine
from attnbench.plan import validate
from attnbench.runner import MemoryModel
from attnbench.store import read_rows

DEFAULT = Path(__file__).parent.parent / "results/reference/table3-v100_16gb-cpu"


def main(argv: list[str]) -> int:
    run = Path(argv[0]) if argv else DEFAULT
    if not (run / "cells.jsonl").is_file():
        print(f"replay_cost: {run}: holds no cells.jsonl", file=sys.stderr)
        return 2
    allocated_s = replayed_s = 0.0
    cells = 0
    for row in read_rows(run / "cells.jsonl"):  # flat: a schema-3 line's spec fields too
        if row.get("status") != "ok" or row.get("batch_asked") != "max":
            continue
        cell = cell_of(row["cell"])
        res = validate(cell)
        model = MemoryModel(cell, res)
        if not model.replayed:
            continue
        start = time.perf_counter()
        allocated, _ = solve_affine(model.peak, res.ceiling, model.fixed)
        middle = time.perf_counter()
        model.replayed_max_batch(allocated, res.usable, cell.allocator)
        replayed_s += time.perf_counter() - middle
        allocated_s += middle - start
        cells += 1
    ratio = (allocated_s + replayed_s) / allocated_s if allocated_s else float("nan")
    print(f"{cells} cells: allocation-only search {allocated_s:.1f} s, the replay after it "
          f"{replayed_s:.1f} s: the search with the replay takes {ratio:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
