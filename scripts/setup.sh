#!/usr/bin/env bash
# Set up tensorwire on a fresh Debian/Ubuntu machine, idempotently:
#   - as root, Debian's packages the benchmarks and tests use (brokers, iperf3, stress-ng,
#     nftables, iproute2); without root it says what is missing and goes on;
#   - a virtual environment in .venv with PyTorch 2.13.0 (see TORCH_BUILD below), then
#     tensorwire installed editable with every extra and the dev tools (pytest, ruff, mypy,
#     mkdocs for the documentation site).
#
# Usage: bash scripts/setup.sh
#   TORCH_BUILD=cpu   (default) the CPU-only build of torch: a CPU wheel pip already finds (a
#                     local wheel directory in pip's configuration) if there is one, else from
#                     PyTorch's CPU wheel index (TORCH_INDEX)
#   TORCH_BUILD=cuda  torch as the package index serves it: on Linux, the CUDA build (GBs)
#   TORCH_BUILD=none  no torch: the library and the benchmarks without a model (no tensorwire.fl)
#   TORCH_SPEC=torch==2.13.0   the requirement; TORCH_INDEX=URL   the CPU build's index
#   PYTHON=python3.12          the interpreter that makes .venv
# A torch already in .venv is kept, whichever build it is.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_BUILD=${TORCH_BUILD:-cpu}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

case "$TORCH_BUILD" in
  cpu|cuda|none) ;;
  *) echo "setup: TORCH_BUILD must be cpu, cuda or none, not '$TORCH_BUILD'" >&2; exit 2 ;;
esac

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

# torch first and pinned: left to the resolver, torch would be whatever the index serves,
# which on Linux is the multi-GB CUDA build.
torch_installed() { .venv/bin/python -c "import torch" >/dev/null 2>&1; }
if [ "$TORCH_BUILD" != none ] && ! torch_installed; then
  if [ "$TORCH_BUILD" = cuda ]; then
    echo "setup: installing $TORCH_SPEC (the index's build: CUDA on Linux)"
    "${PIP[@]}" install "$TORCH_SPEC"
  else
    # "+cpu" names the CPU build; a wheel directory pip is configured with may hold it.
    echo "setup: installing $TORCH_SPEC, CPU build"
    if ! "${PIP[@]}" install "${TORCH_SPEC}+cpu" 2>/dev/null; then
      echo "setup: no CPU wheel among pip's configured sources; using $TORCH_INDEX"
      "${PIP[@]}" install "$TORCH_SPEC" --index-url "$TORCH_INDEX"
    fi
  fi
fi

# The installed torch pinned, so that resolving the extras keeps it (build included).
pin=()
if torch_installed; then
  # (stderr hidden: before numpy is in, torch warns "Failed to initialize NumPy")
  pin=("torch==$(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null)")
fi
if [ "$TORCH_BUILD" = none ] && ! torch_installed; then
  "${PIP[@]}" install -e ".[zmq,mqtt,amqp,flight,quic,bench,dev]"
else
  "${PIP[@]}" install -e ".[all,dev]" "${pin[@]}"
fi
echo "setup: ready ($(.venv/bin/tensorwire --version); torch: $(.venv/bin/python -c \
  'import torch; print(torch.__version__)' 2>/dev/null || echo none))"
