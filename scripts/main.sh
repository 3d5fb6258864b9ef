#!/usr/bin/env bash
# Set up, then run the main job: tensorwire over TCP against a raw socket on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tensorwire bench transfer "$@"
