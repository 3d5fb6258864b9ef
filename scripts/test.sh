#!/usr/bin/env bash
# Set up, then run the linters, the documentation build, the type checker and the whole test
# suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests
.venv/bin/ruff format --check src tests
# the site, into build/site (not --quiet: it hides the warnings --strict fails on); a test
# reads the built site, so it comes first
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
# The type checker runs beside the tests (mostly one core for a minute or two, while the
# tests mostly wait on sockets); its output follows the tests', and either failing fails
# the whole. Files and settings: [tool.mypy] in pyproject.toml.
mypy_log=$(mktemp)
trap 'rm -f "$mypy_log"' EXIT
.venv/bin/mypy > "$mypy_log" 2>&1 &
mypy_pid=$!
# 4 workers (TW_TEST_WORKERS; 0 runs serially): most tests wait on sockets, brokers and
# namespaces, so 4 fit on 2 cores; a worker that runs out of tests takes half of the busiest
# one's queue (--dist worksteal), so that no long test waits behind another at the end
# (tests/conftest.py says how the tests are handed out)
rc=0
dist=()
if [ "${TW_TEST_WORKERS:-4}" != 0 ]; then dist=(--dist worksteal); fi
# --durations: the 20 slowest tests, for whoever wants the suite faster
.venv/bin/python -m pytest -n "${TW_TEST_WORKERS:-4}" "${dist[@]}" --durations=20 "$@" || rc=$?
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
echo "--- mypy"
cat "$mypy_log"
if [ "$mypy_rc" != 0 ]; then
  echo "test.sh: mypy failed (its output is above)" >&2
  rc=1
fi
exit $rc
