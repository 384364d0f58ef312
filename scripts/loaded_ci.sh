#!/usr/bin/env bash
# .ci/run on a fresh clone of this repository while two busy loops load both cores: the proof
# that CI holds on a loaded machine (docs/gate.md, "busy"). The 1-minute load is sampled every
# 60 s into $OUT.load, the run's output goes to $OUT.log, its exit status last in the log.
#   bash scripts/loaded_ci.sh [OUT]   (default /tmp/ci-loaded)
set -u
out=${1:-/tmp/ci-loaded}
here=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$out" && git clone -q "$here" "$out" && cd "$out" || exit 1
pids=()
for _ in 1 2; do python3 -c "while True: pass" & pids+=($!); done
(while true; do echo "$(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out.load"; sleep 60; done) &
pids+=($!)
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
start=$(date +%s)
CI=true PYTEST_ADDOPTS=--durations=20 bash .ci/run > "$out.log" 2>&1
echo "EXIT $? after $(( $(date +%s) - start )) s" >> "$out.log"
