#!/usr/bin/env bash
# The test command of the README: set up (idempotent), then every test but the GPU ones.
# Docker and Ray tests never skip: a missing daemon is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# Test folders have no __init__.py (rootdir-relative imports), so two test files with one basename
# break collection for the whole run: name them here instead of pytest's "import file mismatch".
dups=$(find tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d)
if [ -n "$dups" ]; then
  echo "test.sh: test file basenames must be unique under tests/ (rename one of each):" >&2
  for d in $dups; do find tests -name "$d" >&2; done
  exit 2
fi
bash scripts/setup.sh
exec .venv/bin/pytest -m "not gpu" "$@"
