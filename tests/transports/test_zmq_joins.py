"""zmq+tcp:// joins when the hub is slow to answer: a channel whose TCP connection is up waits
for its ZMTP handshake instead of starting over every second (at 2,000 clients joining at
once, hundreds of abandoned handshakes queued new ones behind them)."""

from __future__ import annotations

import contextlib
import socket
import threading

import numpy as np
import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (extra 'zmq')")

from zmq_helpers import T, fixture_hub  # noqa: E402, F401  (a fixture: hub)

import tensorwire  # noqa: E402
from tensorwire.transports.url import host_port  # noqa: E402
from tensorwire.transports.zmq.channel import CONNECT_ATTEMPT_S  # noqa: E402


class SlowHandshakes:
    """A TCP proxy in front of a hub that passes nothing either way for ``delay`` seconds
    after it accepts a connection: a hub whose I/O thread is busy with other handshakes."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.accepted = 0
        self._target, self._delay = target, delay
        self._stop = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> SlowHandshakes:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for s in self._sockets:
            s.close()

    def _accept(self) -> None:
        for _ in range(100):  # bounded: a test's few connections
            try:
                a, _ = self._server.accept()
            except OSError:
                return
            self.accepted += 1
            self._sockets.append(a)
            threading.Thread(target=self._forward, args=(a,), daemon=True).start()

    def _forward(self, a: socket.socket) -> None:
        if self._stop.wait(self._delay):  # the busy hub: nothing moves meanwhile
            return
        b = socket.create_connection(self._target, timeout=T)
        self._sockets.append(b)
        for src, dst in ((a, b), (b, a)):
            threading.Thread(target=_pump, args=(src, dst), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        for _ in range(1_000_000):  # bounded: ends when either side closes
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def test_a_channel_waits_for_a_slow_handshake_instead_of_starting_over(hub):
    with SlowHandshakes(host_port(hub.url), delay=2.5 * CONNECT_ATTEMPT_S) as proxy:
        url = f"zmq+tcp://127.0.0.1:{proxy.port}"
        with tensorwire.connect(url, client_id="patient", timeout=T) as ch:
            ch.send({"v": np.arange(3)}, timeout=T)
            assert hub.recv(timeout=T)[0] == "patient"
        assert proxy.accepted == 1  # one connection, its handshake waited for
    assert [e for e in hub.events if e.kind == "refused"] == []
