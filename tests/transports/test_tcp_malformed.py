"""Garbage injected into a TCP hub's sockets: typed errors, and the other clients are served."""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest
from waiting import until

import tensorwire
from tensorwire.errors import BadMagic, ChecksumMismatch
from tensorwire.transports.session import ClientSession
from tensorwire.transports.url import host_port
from tensorwire.wire import encode_message

T = 20.0


@pytest.fixture
def hub():
    with tensorwire.serve("tcp://127.0.0.1:0") as h:
        yield h


def _raw_client(hub: tensorwire.Hub, client_id: str) -> socket.socket:
    sock = socket.create_connection(host_port(hub.url), timeout=T)
    hello = ClientSession(client_id, decoders=[], max_message_bytes=1 << 20).hello()
    sock.sendall(hello.to_bytes())
    assert sock.recv(4) == b"TWIR"  # the welcome begins
    return sock


def test_garbage_before_hello_is_refused_and_others_are_served(hub, caplog):
    good = tensorwire.connect(hub.url, client_id="good")
    hub.wait_for(1, timeout=T)
    with caplog.at_level(logging.WARNING, logger="tensorwire"):
        junk = socket.create_connection(host_port(hub.url), timeout=T)
        junk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 64)
        assert junk.recv(16) == b""  # the hub hangs up on it
    assert "refused a session" in caplog.text and "bad magic" in caplog.text
    good.send({"v": np.arange(3)})
    assert hub.recv(timeout=T)[0] == "good"
    good.close()


def test_joined_client_sending_garbage_is_dropped_with_reason(hub):
    good = tensorwire.connect(hub.url, client_id="good")
    reasons = {}
    hub.on_leave = lambda cid, reason: reasons.setdefault(cid, reason)
    evil = _raw_client(hub, "evil")
    hub.wait_for(2, timeout=T)
    evil.sendall(b"\xde\xad\xbe\xef" * 16)
    assert until(lambda: "evil" in reasons)
    assert "not a tensorwire message" in reasons["evil"]
    assert any(isinstance(e, BadMagic) for cid, e in hub.errors if cid == "evil")
    assert hub.clients == ["good"]
    hub.send("good", {"v": np.arange(4)})
    assert np.array_equal(good.recv(timeout=T)["v"], np.arange(4))
    good.send({"ok": np.ones(1)})
    assert hub.recv(timeout=T)[0] == "good"
    good.close()


def test_corrupt_message_is_dropped_but_the_connection_lives(hub):
    sock = _raw_client(hub, "flaky")
    hub.wait_for(1, timeout=T)
    bad = bytearray(encode_message({"x": np.arange(100.0)}, {"n": 1}).to_bytes())
    bad[-20] ^= 0xFF  # inside the tensor bytes: framing intact, checksum wrong
    good = encode_message({"x": np.arange(100.0)}, {"n": 2}).to_bytes()
    sock.sendall(bytes(bad) + good)
    client, msg = hub.recv(timeout=T)
    assert client == "flaky" and msg.meta == {"n": 2}
    assert any(isinstance(e, ChecksumMismatch) for _, e in hub.errors)
    assert hub.clients == ["flaky"]
    sock.close()


def test_hello_that_never_comes_times_out_without_blocking_others(hub, monkeypatch):
    silent = socket.create_connection(host_port(hub.url), timeout=T)  # says nothing
    good = tensorwire.connect(hub.url, client_id="good")
    hub.wait_for(1, timeout=T)
    good.send({"v": np.zeros(2)})
    assert hub.recv(timeout=T)[0] == "good"
    silent.close()
    good.close()
