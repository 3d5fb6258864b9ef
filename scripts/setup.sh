#!/usr/bin/env bash
# Set up tensorwire on a fresh Debian/Ubuntu machine, idempotently:
#   - as root, Debian's packages the benchmarks and tests use (brokers, iperf3, stress-ng,
#     nftables, iproute2); without root it says what is missing and goes on;
#   - a virtual environment in .venv with PyTorch 2.13.0 (CPU build where one is on disk)
#     and tensorwire installed editable with every extra.
# Usage: bash scripts/setup.sh            (PYTHON=python3.12 to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

missing=()
for pair in mosquitto:mosquitto rabbitmq-server:rabbitmq-server iperf3:iperf3 \
            stress-ng:stress-ng nft:nftables ip:iproute2 tc:iproute2; do
  cmd=${pair%%:*} pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian packages: $pkgs"
    # policy-rc.d: install the brokers without starting system services; tensorwire starts
    # its own on private ports when none is running.
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
      made_policy=1
    fi
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs; } >/dev/null; then
      echo "setup: warning: apt-get could not install $pkgs; tests that need them will be skipped" >&2
    fi
    if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  else
    echo "setup: note: not root, so not installing $pkgs (apt-get install $pkgs); tests that need them will be skipped" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip >/dev/null
# torch first and pinned: left to the resolver, an unpinned torch pulls a multi-GB CUDA build.
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  "${PIP[@]}" install "$TORCH_SPEC"
fi
"${PIP[@]}" install -e ".[all,dev]" "$TORCH_SPEC"
echo "setup: ready ($(.venv/bin/tensorwire --version))"
