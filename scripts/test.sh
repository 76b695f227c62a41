#!/usr/bin/env bash
# Set up pocket_agent with its dev, convert, server, ray and train extras in .venv, build the cached test
# models, and run the whole test suite. Exits non-zero if any test fails or none ran.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/setup_env.sh" "dev,convert,server,ray,train"
PY="$ROOT/.venv/bin/python"
# SmolLM2 converted to MNN, built once per machine into ~/.cache/pocket_agent (about a minute).
"$PY" scripts/build_fixtures.py --skip-tiny --smollm2
set +e
"$PY" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
exit "$rc"
