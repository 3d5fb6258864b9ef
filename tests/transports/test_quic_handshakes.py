"""A quic hub's handshakes under a join storm (issue #27): a handshake younger than
``HANDSHAKE_MIN_WAIT`` is never pushed out of a full room (the newcomer's Initial is dropped
and its QUIC sends it again), and an older one that never finished makes room."""

from __future__ import annotations

import contextlib
import socket
import time

import pytest

import tensorwire
from tensorwire.errors import TransportTimeout
from tensorwire.transports.url import host_port

pytest.importorskip("aioquic", reason="quic needs aioquic (extra tensorwire[quic])")

T = 20.0  # seconds: a generous bound for what should take well under one


@contextlib.contextmanager
def _half_open(url: str):
    """A client that sends its QUIC Initial to the hub at ``url`` and never answers."""
    from aioquic.quic.connection import QuicConnection

    from tensorwire.transports.quic.settings import parse_quic_url
    from tensorwire.transports.quic.tls import channel_configuration

    host, port = host_port(url)
    conn = QuicConnection(configuration=channel_configuration(parse_quic_url(url), None, host))
    now = time.monotonic()
    conn.connect((host, port), now=now)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for data, addr in conn.datagrams_to_send(now=now):
            sock.sendto(data, addr)
        yield


def _held(hub) -> int:
    return len(hub._handshakes)


def _until(cond, what: str) -> None:
    deadline = time.monotonic() + T
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def test_a_young_handshake_is_not_pushed_out_by_a_newcomer(monkeypatch):
    from tensorwire.transports.quic import hub as quic_hub

    monkeypatch.setattr(quic_hub, "MAX_HANDSHAKES_PER_SOURCE", 1)
    monkeypatch.setattr(quic_hub, "HANDSHAKE_MIN_WAIT", 3600.0)
    with tensorwire.serve("quic://127.0.0.1:0", codec=None) as hub, _half_open(hub.url):
        _until(lambda: _held(hub) == 1, "the hub runs the half-open handshake")
        with pytest.raises(TransportTimeout):  # its Initials dropped, never a push-out
            tensorwire.connect(hub.url, client_id="late", codec=None, timeout=2.0)
        assert _held(hub) == 1 and hub.clients == []


def test_a_handshake_that_never_finishes_makes_room_once_old(monkeypatch):
    from tensorwire.transports.quic import hub as quic_hub

    monkeypatch.setattr(quic_hub, "MAX_HANDSHAKES_PER_SOURCE", 1)
    monkeypatch.setattr(quic_hub, "HANDSHAKE_MIN_WAIT", 0.3)
    with tensorwire.serve("quic://127.0.0.1:0", codec=None) as hub, _half_open(hub.url):
        _until(lambda: _held(hub) == 1, "the hub runs the half-open handshake")
        with tensorwire.connect(hub.url, client_id="good", codec=None, timeout=T):
            assert hub.wait_for(1, timeout=T) == ["good"]
        assert _held(hub) == 0  # the half-open one was pushed out, the good one finished
