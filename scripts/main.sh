#!/usr/bin/env bash
# The main job of the README, end to end on the embedded default (local Docker daemon, CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/agentenv quickstart "$@"
