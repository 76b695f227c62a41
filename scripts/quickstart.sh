#!/usr/bin/env bash
# Set up pocket_agent in .venv and run the quick-start example on the embedded default model.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" ""
cd "$ROOT/examples" && exec "$ROOT/.venv/bin/python" extract_invoice.py
