#!/usr/bin/env bash
# On a CUDA machine: first what has never run on a GPU (kernel=fla beside kernel=torch for
# each recurrent mixer: forward, training step, decode, packed; an fp32 Gated DeltaNet; flex
# training after a forward; decode over a mix; packed against padded; the allocator with
# expandable segments against the default), then the rest of the first run: real vs modeled
# max batch, probes and time ratios under the 16 GB V100 ceiling, training, compiled cells and
# serving (see scripts/gpu_check.py). Options pass through:
#   --budget SECONDS   stop before this many seconds from now (start-up and transfers to the
#                      machine not included): rows.jsonl, table.md and gpu.txt are written
#                      all the same; --resume goes on from where it stopped
#   --plan             the cells in order with their estimated seconds (no GPU, writes nothing)
#   --decode-only, --decode-device PRESET (default h100_80gb; v100_16gb below 80 GB)
# Commit results/gpu_check/ afterwards.
set -euo pipefail
started=$(date +%s.%N)  # --budget counts from here
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import attnbench.conf" 2>/dev/null; then
    echo "gpu_check: attnbench is not installed for $PY; run: $PY -m pip install -e ." >&2
    exit 2
fi
# a bad argument is one line and exit 2 before anything is written; --plan writes nothing
"$PY" scripts/gpu_check.py --check-args "$@"
for arg in "$@"; do
    if [ "$arg" = --plan ]; then
        exec "$PY" scripts/gpu_check.py --out results/gpu_check/rows.jsonl "$@"
    fi
done
if ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: error: needs a CUDA GPU (torch.cuda.is_available() is False)" >&2
    exit 2  # before anything is written
fi
mkdir -p results/gpu_check
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > results/gpu_check/gpu.txt || true
"$PY" scripts/gpu_check.py --out results/gpu_check/rows.jsonl --started "$started" "$@" \
    | tee results/gpu_check/table.md
