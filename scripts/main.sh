#!/usr/bin/env bash
# Set up, then run the main job: the quick FedComm-style comparison (digits, VGG-5, 4 devices,
# 3 rounds, every protocol, 4G link) on the namespace testbed; without root, on loopback
# (labelled so). Prints the table and the path of report.html.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tensorwire bench fl --quick "$@"
