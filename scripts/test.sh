#!/usr/bin/env bash
# Set up, then run the linters, the type checker, the documentation build and the whole test
# suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests
.venv/bin/ruff format --check src tests
.venv/bin/mypy                                   # files and settings: [tool.mypy] in pyproject.toml
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict   # the site, into build/site (not --quiet: it hides the warnings --strict fails on)
# 4 workers (TW_TEST_WORKERS; 0 runs serially): most tests wait on sockets, brokers and
# namespaces, so 4 fit on 2 cores (tests/conftest.py says how the tests are handed out)
exec .venv/bin/python -m pytest -n "${TW_TEST_WORKERS:-4}" "$@"
