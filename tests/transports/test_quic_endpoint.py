"""quic:// channels of one process share one UDP socket and I/O thread per hub (issue #27:
a thread and a socket per channel starved the hub at 2,000 simulated devices), yet each
channel keeps its own faults: one closing leaves the others, a port nobody listens on fails
a dial at once, and the last channel to close stops the thread. An engine reads between its
sends (a hub sending for a whole turn let its socket overflow) without time going back."""

from __future__ import annotations

import contextlib
import socket
import threading

import numpy as np
import pytest
from waiting import until

import tensorwire
from tensorwire.errors import TransportTimeout

pytest.importorskip("aioquic", reason="aioquic is not installed (extra 'quic')")

T = 30.0
URL = "quic://127.0.0.1:0?mtu=16000"


def _client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tensorwire-quic-client")]


def _round(hub, channels: dict[str, tensorwire.Channel], payload: np.ndarray) -> None:
    """A broadcast to every channel and a reply from each, checked."""
    result = hub.broadcast({"w": payload}, timeout=T)
    assert not result.failed, result.failed
    for cid, ch in channels.items():
        assert np.array_equal(ch.recv(timeout=T)["w"], payload)
        ch.send({"u": payload[:1000]}, meta={"from": cid}, timeout=T)
    got = sorted(hub.recv(timeout=T)[1].meta["from"] for _ in channels)
    assert got == sorted(channels)


def _connect(stack: contextlib.ExitStack, url: str, n: int) -> dict:
    """``n`` channels to ``url``, by client id, each closed by ``stack``."""
    return {
        f"c{i}": stack.enter_context(
            tensorwire.connect(url, client_id=f"c{i}", codec=None, timeout=T)
        )
        for i in range(n)
    }


def test_channels_of_one_process_share_one_thread_and_each_closes_alone():
    payload = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: many datagrams each way
    assert _client_threads() == []
    with tensorwire.serve(URL, codec=None) as hub, contextlib.ExitStack() as stack:
        channels = _connect(stack, hub.url, 3)
        hub.wait_for(3, timeout=T)
        assert len(_client_threads()) == 1  # before: one per channel
        _round(hub, channels, payload)
        channels.pop("c0").close()
        assert until(lambda: hub.clients == ["c1", "c2"], T), hub.clients
        _round(hub, channels, payload)  # the others go on, on the same socket
        assert len(_client_threads()) == 1
    assert until(lambda: _client_threads() == [], T), "the last channel left its thread"


def test_a_dial_to_a_port_nobody_listens_on_fails_at_once_and_retries():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # closed now: the kernel answers every datagram there with "port unreachable"
    with pytest.raises(TransportTimeout, match="nobody listens there") as info:
        tensorwire.connect(f"quic://127.0.0.1:{port}", client_id="x", codec=None, timeout=1.5)
    # each attempt failed at once (before: one attempt waited out its handshake timeout)
    assert int(str(info.value).split("(")[1].split(" attempts")[0]) >= 3, info.value
    assert until(lambda: _client_threads() == [], T)


def test_an_engine_reading_between_every_send_keeps_its_connections(monkeypatch):
    """Reads between sends feed a connection datagrams of a later time than the turn began
    at: aioquic then built an acknowledgement delay below zero and failed (each connection
    closed with "internal error") until the engine gave each connection the time of its
    own sending."""
    from tensorwire.transports.quic import engine

    monkeypatch.setattr(engine, "RECV_EVERY", 1)
    payload = np.arange(1 << 18, dtype=np.float32)
    with tensorwire.serve(URL, codec=None) as hub, contextlib.ExitStack() as stack:
        channels = _connect(stack, hub.url, 4)
        hub.wait_for(4, timeout=T)
        for _ in range(3):
            _round(hub, channels, payload)
        assert hub.clients == sorted(channels)
