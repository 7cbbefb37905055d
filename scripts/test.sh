#!/usr/bin/env bash
# The test command of the README: set up (idempotent), then every test but the GPU ones.
# Docker and Ray tests never skip: a missing daemon is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pytest -m "not gpu" "$@"
