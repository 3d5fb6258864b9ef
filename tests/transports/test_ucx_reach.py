"""A ucx:// hub served on loopback is reachable from loopback only, although UCX's listener
accepts on every address of its host: a device in another network namespace that dials the
hub's host through its veth is refused, and the hub says why, while one on the hub's own
loopback joins. (In the testbed the hub's UCX could not have answered that device anyway: the
server's address is on a bridge, a device UCX does not use; the reach check is what refuses
it where UCX could.)

This file is also the program that runs in each namespace:
``python tests/transports/test_ucx_reach.py hub|client URL``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensorwire.testbed import Testbed, probe_capabilities

HERE = Path(__file__)
# The hub's UCX may use every device of its namespace (loopback and the veth to the device),
# so that only the reach check, not UCX's device list, can stop the stranger.
EVERY_DEVICE = "ucx_net_devices=all"


def _hub() -> None:
    import tensorwire

    with tensorwire.serve(f"ucx://127.0.0.1:0?{EVERY_DEVICE}") as hub:
        with tensorwire.connect(hub.url, client_id="local", timeout=30) as local:
            hub.wait_for(1, timeout=30)
            hub.send("local", {}, meta={"hello": "local"}, timeout=30)
            assert local.recv(timeout=30).meta == {"hello": "local"}
        print(hub.url, flush=True)
        sys.stdin.read()  # until the test closes our stdin
        print("clients", hub.clients, flush=True)


def _client(url: str) -> None:
    import tensorwire
    from tensorwire.errors import TensorwireError

    try:
        with tensorwire.connect(url, client_id="stranger", timeout=15) as ch:
            ch.send({}, meta={"from": "afar"}, timeout=15)
            print("joined", flush=True)
    except TensorwireError as exc:
        print(f"refused {type(exc).__name__}: {exc}", flush=True)


def test_a_hub_on_loopback_refuses_a_device_that_reaches_it_from_another_address(tmp_path):
    pytest.importorskip("ucxx", reason="ucxx is not installed (extra 'ucx')")
    caps = probe_capabilities()
    if caps.mode != "root":
        pytest.skip(f"a second address needs named network namespaces: {caps['netns'].reason}")
    with Testbed(devices=1, profile="lan") as tb:
        log = tmp_path / "hub.log"
        with open(log, "wb") as err:
            hub = tb.popen(
                "srv",
                [sys.executable, str(HERE), "hub"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        try:
            assert hub.stdout is not None and hub.stdin is not None
            url = hub.stdout.readline().decode().strip()  # after the local device's round trip
            assert url.startswith("ucx://127.0.0.1:"), log.read_text()[-2000:]
            port = url.split(":")[2].split("?")[0]
            afar = f"ucx://{tb.server_address}:{port}?{EVERY_DEVICE}"
            started = time.monotonic()
            said = subprocess.run(
                tb.command("dev1", [sys.executable, str(HERE), "client", afar]),
                capture_output=True,
                timeout=120,
            )
            # the last line is the helper's (UCX logs its rejected attempts above it)
            out = said.stdout.decode().strip().splitlines()[-1:]
            assert out and out[0].startswith("refused"), said.stdout.decode()[-3000:]
            assert time.monotonic() - started < 60  # refused, not left to time out at length
            hub.stdin.close()
            rest = hub.stdout.read().decode()
            assert hub.wait(timeout=60) == 0, log.read_text()[-2000:]
            assert "stranger" not in rest
            text = log.read_text()
            assert f"a connection from {tb.address('dev1')}" in text, text[-2000:]
        finally:
            if hub.poll() is None:
                hub.kill()
                hub.wait()


if __name__ == "__main__":
    {"hub": lambda: _hub(), "client": lambda: _client(sys.argv[2])}[sys.argv[1]]()
