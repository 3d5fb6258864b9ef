#!/usr/bin/env bash
# Set up, then run the linters and the whole test suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests
.venv/bin/ruff format --check src tests
exec .venv/bin/python -m pytest "$@"
