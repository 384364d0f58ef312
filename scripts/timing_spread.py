"""Summarise scripts/timing_spread.sh: per cell, the time per sequence of each run with the
malloc thresholds adaptive and fixed, and the spread (max / min - 1) across runs.

    python scripts/timing_spread.py /tmp/attnbench-spread [MORE_DIRS ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import attnbench


def main(outs: list[Path]) -> int:
    spreads = {}
    for mode in ("adaptive", "fixed"):
        runs = sorted(p for out in outs for p in out.glob(f"{mode}-*") if p.is_dir())
        frame = attnbench.load(*runs)
        frame["k"] = frame["k"].fillna(0)  # k = 0: no budget (vanilla)
        frame["run"] = [str(runs.index(Path(d).parent.parent)) for d in frame["run_dir"]]
        ms = frame.pivot_table(index=["attention", "k"], columns="run", values="time_per_seq_s")
        ms = ms * 1e3
        spread = ms.max(axis=1) / ms.min(axis=1) - 1
        iqr = (frame["time_iqr_s"] / frame["time_median_s"]).max()
        print(f"\n{mode}: ms per sequence, run by run; spread = max/min - 1")
        print(ms.assign(spread=spread.map("{:.1%}".format)).round(1).to_string())
        print(f"largest IQR/median of a cell: {iqr:.1%}")
        spreads[mode] = spread
    print(
        f"\nmedian spread: adaptive {spreads['adaptive'].median():.1%}, "
        f"fixed {spreads['fixed'].median():.1%}; largest: adaptive "
        f"{spreads['adaptive'].max():.1%}, fixed {spreads['fixed'].max():.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main([Path(p) for p in sys.argv[1:]] or [Path("/tmp/attnbench-spread")]))
