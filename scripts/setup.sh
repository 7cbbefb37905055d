#!/usr/bin/env bash
# Install everything AgentENV needs on a fresh Debian machine, from the project's own files:
# apt packages, a virtualenv with the project, and the offline base image (built only when its
# recipe hash is missing). Safe to run again: each step skips what is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(debootstrap bubblewrap tmux postgresql)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "setup: the Docker daemon is unreachable (docker info failed); AgentENV needs it" >&2
  exit 1
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.agentenv-installed
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing the project into .venv"
  .venv/bin/pip install -q -U pip
  .venv/bin/pip install -q -e ".[all,dev]"
  echo "$want" > "$stamp"
fi

.venv/bin/agentenv image build-base
