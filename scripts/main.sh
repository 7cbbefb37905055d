#!/usr/bin/env bash
# The main job of the README, end to end on the embedded default (local Docker daemon, CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p runs
# Warm start, RL in Docker sandboxes, held-out evaluations; curve, report and summary under runs/.
exec .venv/bin/agentenv train examples/quickstart.yaml --json runs/quickstart.json "$@"
