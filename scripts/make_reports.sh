#!/usr/bin/env bash
# Regenerate reports/ from the committed reference runs: one report per run directory under
# results/reference/, written to reports/<run name>/ (replaced whole). Needs the plot extra:
#   pip install -e '.[plot]' && bash scripts/make_reports.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for run in results/reference/*/; do
    name=$(basename "$run")
    attnbench report "${run%/}" --out "reports/$name" --quiet
done
