"""A rank's link closes cleanly: after its bye it reads its peer to the end, so its socket
never closes with bytes unread (which resets the connection, and a reset can cost the peer
what came last: through a proxy or a middlebox, the bye itself and what a barrier waits for).
A peer that reads a bye ends its own side at once, so the closing rank does not wait; one
that never does (hung) delays the close by its deadline, no more."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

from tensorwire.collective import messages
from tensorwire.collective.connection import RankConnection
from tensorwire.collective.state import GroupState
from tensorwire.errors import PeerGone, TransportTimeout
from tensorwire.transports.sockets import StreamReader, send_encoded, tune
from tensorwire.wire import MessageStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transports"))
from waiting import until

ROUNDS = 10


def _connected() -> tuple[socket.socket, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    with server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    tune(a)
    tune(b)
    return a, b


def _rank_zero(sock: socket.socket) -> RankConnection:
    state = GroupState(0, 2, 30.0)
    conn = RankConnection(1, sock, StreamReader(sock, MessageStream()), state, 0.5)
    state.add_connection(conn)
    return conn


def _chatty_peer(sock: socket.socket, half_close_on_bye: bool) -> dict[str, object]:
    """Rank 1 by hand: sends heartbeats as fast as it can (bytes rank 0 has not read yet
    when it closes); on rank 0's bye ends its own side if told to; reads to the end and
    says how the connection ended."""
    seen: dict[str, object] = {}
    stop = threading.Event()

    def chatter() -> None:
        for _ in range(100_000):  # bounded: ends when the link does
            if stop.is_set():
                return
            try:
                send_encoded(sock, messages.beat(0), time.monotonic() + 5)
            except (PeerGone, TransportTimeout, OSError):
                return

    sender = threading.Thread(target=chatter, daemon=True)
    sender.start()
    reader = StreamReader(sock, MessageStream())
    try:
        for _ in range(100_000):
            msg = reader.read_message(time.monotonic() + 10)
            if msg.kind == messages.BYE:
                seen["bye"] = True
                if half_close_on_bye:
                    stop.set()
                    sender.join(5)
                    sock.shutdown(socket.SHUT_WR)
    except (PeerGone, OSError) as exc:  # OSError: a reset, as the old close made
        seen["end"] = str(exc)
    finally:
        stop.set()
        sender.join(5)
        sock.close()
    return seen


def _close_against_a_chatty_peer() -> tuple[dict[str, object], float]:
    """What the peer saw of rank 0's close, and how long the close took."""
    a, b = _connected()
    conn = _rank_zero(a)
    seen: dict[str, object] = {}
    peer = threading.Thread(target=lambda: seen.update(_chatty_peer(b, True)))
    heard = conn.last_heard
    peer.start()
    assert until(lambda: conn.last_heard > heard)  # its heartbeats are coming in
    started = time.monotonic()
    conn.close(5.0)
    took = time.monotonic() - started
    peer.join(10)
    return seen, took


def test_a_closing_rank_reads_its_chatty_peer_to_the_end_and_never_resets_it():
    for _ in range(ROUNDS):
        seen, took = _close_against_a_chatty_peer()
        assert seen.get("bye"), seen
        assert "reset" not in str(seen.get("end")), seen  # a FIN: everything was read
        assert took < 4.0, took  # the peer ended its side on the bye: not the 5 s deadline


def test_a_hung_peer_delays_the_close_by_its_deadline_only():
    a, b = _connected()  # b: a peer that reads nothing and never closes
    conn = _rank_zero(a)
    try:
        started = time.monotonic()
        conn.close(0.5)
        took = time.monotonic() - started
    finally:
        b.close()
    assert 0.4 < took < 3.0, took
