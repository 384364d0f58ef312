#!/usr/bin/env bash
# How much the n = 2048 row of the CPU Table 3 moves between whole runs, with glibc's malloc
# thresholds left adaptive (ATTNBENCH_MALLOC_FIX=0, as before attnbench fixed them) and fixed
# (the default), interleaved so that a machine that slows down slows both alike:
#   bash scripts/timing_spread.sh [RUNS] [OUT_DIR]      (default 3 runs each, /tmp/attnbench-spread)
# then:  python scripts/timing_spread.py OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
out=${2:-/tmp/attnbench-spread}
mkdir -p "$out"
for i in $(seq "$runs"); do
    for mode in adaptive fixed; do
        fix=1; [ "$mode" = adaptive ] && fix=0
        start=$(date +%s)
        ATTNBENCH_MALLOC_FIX=$fix attnbench run +sweep=table3 n=2048 progress=false report=false \
            out_dir="$out/$mode-$i" > "$out/$mode-$i.log" 2>&1
        echo "$mode-$i: $(( $(date +%s) - start )) s"
    done
done
