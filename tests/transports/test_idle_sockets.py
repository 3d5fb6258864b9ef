"""Idle sockets cannot keep devices out of a hub (issue #27): connections that say nothing
wait in the listener's selector, not in a thread each; the oldest make room for new ones;
each is closed after ``SILENT_S``; a device, which speaks at once, joins at once."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid

import pytest

import tensorwire
from tensorwire.transports.shm.options import address
from tensorwire.transports.sockets import listener
from tensorwire.transports.url import host_port

T = 20.0  # seconds: a generous bound for what should take milliseconds
IDLE = 200  # the case: 200 idle sockets held open
JOIN_S = 2.0  # a device's whole connect deadline: a lockout (10 s before) fails it


def _until(cond, what: str) -> None:
    deadline = time.monotonic() + T
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def _idle_tcp(url: str) -> socket.socket:
    return socket.create_connection(host_port(url), timeout=T)


def _idle_shm(url: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(address(url.removeprefix("shm://")))
    return sock


CASES = {
    "tcp": ("tcp://127.0.0.1:0", _idle_tcp),
    "shm": (f"shm://tw-idle-{uuid.uuid4().hex[:10]}", _idle_shm),
}


@pytest.mark.parametrize("scheme", sorted(CASES))
def test_a_device_joins_at_once_past_200_idle_sockets_reopened_as_they_close(scheme, monkeypatch):
    monkeypatch.setattr(listener, "SILENT_S", 1.0)  # read as the hub's listener is made
    url, idle = CASES[scheme]
    with tensorwire.serve(url, codec=None) as hub:
        held = [idle(hub.url) for _ in range(IDLE)]

        def expired() -> int:
            return sum("said nothing for" in e.reason for e in hub.events)

        # every one accepted: held silent, or (on a slow machine) already past SILENT_S
        _until(lambda: hub._listener.silent + expired() == IDLE, f"{IDLE} sockets accepted")
        assert not hub._listener._threads  # none costs a thread
        with tensorwire.connect(hub.url, client_id="good", codec=None, timeout=JOIN_S) as ch:
            assert hub.wait_for(1, timeout=T) == ["good"]
            ch.send(meta={"hello": 1})
            assert hub.recv(timeout=T)[0] == "good"
        # the hub closes each after SILENT_S; the attacker reopens them, the next device
        # still gets in
        _until(lambda: any("said nothing for 1 s" in e.reason for e in hub.events), "expiry")
        for sock in held:
            sock.close()
        held = [idle(hub.url) for _ in range(IDLE)]
        with tensorwire.connect(hub.url, client_id="next", codec=None, timeout=JOIN_S):
            _until(lambda: "next" in hub.clients, "the next device is in")
        for sock in held:
            sock.close()


@contextlib.contextmanager
def _idle_quic(url: str, n: int):
    """``n`` QUIC connections to the hub at ``url`` that finish their handshake and then
    say nothing (no hello), held open by an event loop of their own until the block ends."""
    from aioquic.asyncio import connect

    from tensorwire.transports.quic.settings import parse_quic_url
    from tensorwire.transports.quic.tls import channel_configuration

    host, port = host_port(url)
    config = channel_configuration(parse_quic_url(url), None, host)
    opened = threading.Event()
    loop = asyncio.new_event_loop()
    stop = loop.create_future()

    async def one() -> None:
        nonlocal count
        async with connect(host, port, configuration=config):
            count += 1
            if count == n:
                opened.set()
            await stop

    async def hold() -> None:
        await asyncio.gather(*(one() for _ in range(n)))

    count = 0
    thread = threading.Thread(target=loop.run_until_complete, args=(hold(),), daemon=True)
    thread.start()
    try:
        assert opened.wait(T), f"{n} idle QUIC connections did not open in {T} s"
        yield
    finally:
        # aioquic's graceful close drains for seconds: the daemon thread finishes it alone
        loop.call_soon_threadsafe(lambda: stop.done() or stop.set_result(None))


def test_a_device_joins_a_quic_hub_at_once_past_200_idle_connections(monkeypatch):
    pytest.importorskip("aioquic", reason="quic needs aioquic (extra tensorwire[quic])")
    from tensorwire.transports.quic import hub as quic_hub

    # opening 200 takes longer than the hub waits for a hello on a loaded machine: the first
    # would be refused before the last is in (that refusal: the next test)
    monkeypatch.setattr(quic_hub, "HANDSHAKE_TIMEOUT", 2 * T)
    with tensorwire.serve("quic://127.0.0.1:0", codec=None) as hub, _idle_quic(hub.url, IDLE):
        # the client's handshake ends one flight before the hub's: poll for the hub's count
        _until(lambda: len(hub._waiting) == IDLE, "every one of them waits for its hello")
        with tensorwire.connect(hub.url, client_id="good", codec=None, timeout=JOIN_S):
            assert hub.wait_for(1, timeout=T) == ["good"]


def test_a_quic_connection_that_says_no_hello_in_time_is_refused_and_closed(monkeypatch):
    pytest.importorskip("aioquic", reason="quic needs aioquic (extra tensorwire[quic])")
    from tensorwire.transports.quic import hub as quic_hub

    monkeypatch.setattr(quic_hub, "HANDSHAKE_TIMEOUT", 0.5)
    with tensorwire.serve("quic://127.0.0.1:0", codec=None) as hub, _idle_quic(hub.url, 2):
        _until(
            lambda: sum("no hello in time" in e.reason for e in hub.events) == 2,
            "both silent connections refused",
        )
        _until(lambda: not hub._waiting, "their places given back")
        assert hub.clients == []


def test_one_address_cannot_hold_more_than_its_share(monkeypatch):
    monkeypatch.setattr(listener, "MAX_SILENT_PER_SOURCE", 8)
    with tensorwire.serve("tcp://127.0.0.1:0", codec=None) as hub:
        held = [_idle_tcp(hub.url) for _ in range(20)]
        _until(lambda: hub._listener.silent == 8 and len(hub.events) >= 12, "room made")
        assert sum("from its address" in e.reason for e in hub.events) == 12  # the oldest
        assert all(s.recv(1) == b"" for s in held[:12])  # closed by the hub
        for sock in held:
            sock.close()


_SMALL_HUB = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
import tensorwire
with tensorwire.serve("tcp://127.0.0.1:0", codec=None) as hub:
    print(hub.url, hub._listener._silent.total, flush=True)
    sys.stdin.readline()
"""


def test_a_hub_out_of_descriptors_pauses_and_serves_again_when_some_are_freed():
    import subprocess
    import sys

    hub = subprocess.Popen(
        [sys.executable, "-c", _SMALL_HUB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert hub.stdout is not None and hub.stdin is not None
        url, silent_bound = hub.stdout.readline().split()
        assert int(silent_bound) == 16  # a quarter of its 64 descriptors
        joined = []
        for i in range(40):  # each member costs the hub descriptors: it runs out on the way
            try:
                joined.append(tensorwire.connect(url, client_id=f"m{i}", codec=None, timeout=1))
            except tensorwire.TransportError:
                break
        assert len(joined) < 40  # it did run out
        for ch in joined:
            ch.close()
        # the accepting thread paused, never ended: once members left, a device gets in
        with tensorwire.connect(url, client_id="after", codec=None, timeout=JOIN_S * 5) as ch:
            ch.send(meta={"hello": 1})
    finally:
        if hub.stdin is not None:
            hub.stdin.close()
        hub.wait(T)
