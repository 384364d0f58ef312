#!/usr/bin/env bash
# On a CUDA machine: real vs modeled max batch, probes and time ratios under the 16 GB
# V100 ceiling, and serving (mode=decode: the max batch, time per token, achieved bandwidth
# against the GPU's copy bandwidth) for vanilla, vanilla kv_heads=3, sdpa, linear, local and
# the recurrent mixers; the mixers' forward on our cores and, where flash-linear-attention is
# installed, on its kernels (kernel=fla) beside them (see scripts/gpu_check.py). Options pass through: --decode-only runs the serving cells
# alone, --decode-device PRESET sets their ceiling (default h100_80gb; v100_16gb on a
# GPU with less than 80 GB).
# Commit results/gpu_check/ afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import attnbench.conf" 2>/dev/null; then
    echo "gpu_check: attnbench is not installed for $PY; run: $PY -m pip install -e ." >&2
    exit 2
fi
if ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: error: needs a CUDA GPU (torch.cuda.is_available() is False)" >&2
    exit 2  # before anything is written
fi
mkdir -p results/gpu_check
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > results/gpu_check/gpu.txt || true
"$PY" scripts/gpu_check.py --out results/gpu_check/rows.jsonl "$@" | tee results/gpu_check/table.md
