#!/usr/bin/env bash
# Issue #15's demonstration (docs/distill.md): the 3 x 3 teacher grid, the MOPD student and the multi-task
# RL baseline from one shared warm start, every cell evaluated held-out, the thresholds checked.
# Extra arguments go to python -m distill.grid_demo (e.g. --reuse to read back finished stages).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
mkdir -p runs
exec nice -n 10 .venv/bin/python -m distill.grid_demo examples/grid_demo.yaml --json runs/grid_demo.json "$@"
