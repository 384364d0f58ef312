#!/usr/bin/env bash
# Regenerate reports/ from the committed reference runs: one report per run directory under
# results/reference/, written to reports/<run name>/ (replaced whole). A training run's
# report also holds the inference run of the same grid (--also), so that its max-batch plot
# shows both. Needs the plot extra:
#   pip install -e '.[plot]' && bash scripts/make_reports.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for run in results/reference/*/; do
    name=$(basename "$run")
    also=()
    if [[ $name == table3_train-* ]]; then
        also=(--also "results/reference/table3-${name#table3_train-}")
    fi
    attnbench report "${run%/}" --out "reports/$name" --quiet "${also[@]}"
done
