#!/usr/bin/env bash
# On a CUDA machine: real vs modeled max batch, probes and time ratios under the 16 GB
# V100 ceiling (see scripts/gpu_check.py). Commit results/gpu_check/ afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p results/gpu_check
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > results/gpu_check/gpu.txt || true
python scripts/gpu_check.py --out results/gpu_check/rows.jsonl "$@" | tee results/gpu_check/table.md
