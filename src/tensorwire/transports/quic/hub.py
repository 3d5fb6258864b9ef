"""The hub of ``quic://host:port``: one UDP socket and one I/O thread for all its clients.

Each client's first stream carries its ``hello``; the hub answers ``welcome`` (or
``refuse``) on its own first stream, then messages flow one per stream each way.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from typing import Any

from tensorwire.errors import PeerGone, SessionRefused, TransportError, WireError
from tensorwire.transports.base import BYE_TIMEOUT, Hub, HubOptions
from tensorwire.transports.quic.compat import (
    CertificateRequestingConnection,
    TunedQuicConnection,
)
from tensorwire.transports.quic.connection import (
    APP_CLOSED,
    APP_REFUSED,
    APP_REPLACED,
    Arrival,
    Connection,
)
from tensorwire.transports.quic.engine import Engine
from tensorwire.transports.quic.messages import SendJob, decode_stream
from tensorwire.transports.quic.settings import HANDSHAKE_TIMEOUT, parse_quic_url
from tensorwire.transports.quic.tls import hub_configuration, verify_client
from tensorwire.transports.session import (
    HELLO_LIMITS,
    HubSession,
    Joined,
    State,
    bye,
)
from tensorwire.transports.sockets import MAX_SILENT, MAX_SILENT_PER_SOURCE, WaitingRoom
from tensorwire.transports.url import host_port
from tensorwire.wire import EncodedMessage, Message

log = logging.getLogger("tensorwire.transports.quic")

MAX_HANDSHAKES = 1024
"""QUIC handshakes a hub runs at once (each costs it a TLS handshake's CPU): past it, a
new client's Initial is dropped, and its QUIC sends it again, backing off."""
MAX_HANDSHAKES_PER_SOURCE = 256
"""... of them from one address: a host simulating thousands of devices, or an attacker,
gets a quarter of the hub's handshakes, and other hosts the rest (500 joins from one host in
``bench scale``: 4.5 s at 256, 6.8 s at 64, whose dropped Initials waited out backoff)."""
HANDSHAKE_MIN_WAIT = 2.0
"""Seconds a handshake runs before a newcomer may push it out of a full room (refused:
"did not finish its handshake"). Younger ones are never pushed out: under a join storm
(thousands of devices from one host) the newcomers wait outside instead of each undoing a
handshake that was about to finish, which ended with no device joined at 2,000; an attacker
who keeps the room full must start that many handshakes every 2 s."""

SCAN_EVERY = 0.1
"""Seconds between two housekeeping scans of every connection (hello timeouts, keep-alives,
ends, closes after a flush): what such a change waits for at most."""


class QuicHub(Hub):
    """Hub listening on ``quic://host:port`` (UDP; port 0 picks a free one; see :attr:`url`)."""

    protocol = "quic"
    link_timed_by_acks = True  # a send returns once its bytes are with the connection

    def __init__(self, url: str, options: HubOptions) -> None:
        super().__init__(url, options)
        settings = parse_quic_url(url)
        host, port = host_port(url, default_port=0)
        self._config = hub_configuration(settings, self.tls)
        self._mutual = self.tls is not None and self.tls.mutual
        self._ping_every = settings.ping_every
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.bind((host, port))
        query = "" if "?" not in url else "?" + url.split("?", 1)[1]
        self.url = f"quic://{host}:{sock.getsockname()[1]}{query}"
        self._peers: dict[str, Connection] = {}
        self._sessions: dict[Connection, HubSession] = {}
        # connections in their handshake, then with no hello yet (the I/O thread's own)
        self._handshakes: WaitingRoom[Connection] = WaitingRoom(
            MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE
        )
        self._waiting: WaitingRoom[Connection] = WaitingRoom(MAX_SILENT, MAX_SILENT_PER_SOURCE)
        self._lock = threading.Lock()
        self._engine = Engine(sock, f"tensorwire-quic-hub-{sock.getsockname()[1]}", self._accept)
        self._next_scan = 0.0  # time.monotonic() of the next housekeeping scan
        self._engine.tick = self._tick

    # -- on the I/O thread ---------------------------------------------------------------

    def _accept(self, header: Any, addr: Any, now: float) -> Connection | None:
        pushed_since = self._handshakes.would_push(addr[0])
        if pushed_since is not None and now - pushed_since < HANDSHAKE_MIN_WAIT:
            return None  # dropped: the client's QUIC retries its Initial, backing off
        cls = CertificateRequestingConnection if self._mutual else TunedQuicConnection
        conn = cls(
            configuration=self._config, original_destination_connection_id=header.destination_cid
        )
        connection = Connection(
            conn, addr, client_side=False, limits=HELLO_LIMITS, deliver=self._deliver
        )
        connection.on_acked = self._note_link
        connection.on_handshake = self._handshaken
        self._sessions[connection] = HubSession(**self._session_options())
        for old, why in self._handshakes.add(connection, addr[0], now):
            self._refused(old.who, TransportError(f"did not finish its handshake while {why}"))
            old.close(APP_REFUSED, "no handshake in time")
        return connection

    def _handshaken(self, connection: Connection) -> None:
        """Its handshake is done: it waits for its hello now, where the oldest silent ones
        make room for new ones (an idle connection holds off nobody)."""
        session = self._sessions.get(connection)
        if not self._handshakes.remove(connection) or session is None or session.client_id:
            return
        for old, why in self._waiting.add(connection, connection.addr[0], time.monotonic()):
            self._refused(old.who, TransportError(f"said no hello while {why}"))
            old.close(APP_REFUSED, "no hello in time")

    def _tick(self, now: float) -> None:
        """Housekeeping, at most every :data:`SCAN_EVERY` seconds (it looks at every
        connection: run per turn it made each packet cost O(connections)): connections that
        never said hello, keep-alives, connections that ended."""
        if now < self._next_scan:
            return
        self._next_scan = now + SCAN_EVERY
        for connection in list(self._sessions):
            session = self._sessions[connection]
            if connection.closed.is_set():
                self._ended(connection, session)
            elif connection.close_later is not None:
                code, reason, until = connection.close_later
                if connection.flushed or now > until:
                    connection.close(code, reason)
            elif session.client_id is None and now - connection.created > HANDSHAKE_TIMEOUT:
                self._refused(connection.who, TransportError("no hello in time"))
                connection.close(APP_REFUSED, "no hello in time")
            else:
                connection.ping_if_quiet(now, self._ping_every)

    def _ended(self, connection: Connection, session: HubSession) -> None:
        del self._sessions[connection]
        self._handshakes.remove(connection)
        self._waiting.remove(connection)
        cid = session.client_id
        if cid is None:
            return
        connection.log_stats(f"connection of {cid!r} ended")
        with self._lock:
            current = self._peers.get(cid) is connection
            if current:
                del self._peers[cid]
        if current:
            self._left(cid, connection.close_reason or "connection lost", session=connection)

    def _check_certificate(self, connection: Connection) -> str | None:
        """The verified common name of the client's certificate (mutual TLS), else None;
        AuthenticationError for a certificate the hub's CA did not sign."""
        if not self._mutual:
            return None
        assert self.tls is not None and self.tls.ca is not None
        return verify_client(connection.conn, str(self.tls.ca))

    def _deliver(self, connection: Connection, item: Arrival) -> None:
        session = self._sessions.get(connection)
        if session is None or connection.closed.is_set():
            return
        cid = session.client_id
        if item is None:
            if cid is None:
                self._refused(connection.who, TransportError("the hello was withdrawn"))
                connection.close(APP_REFUSED, "the hello was withdrawn")
            return
        try:
            if isinstance(item, WireError):
                raise item
            msg = decode_stream(item, connection.limits)
        except WireError as exc:
            if cid is None:
                self._refused(connection.who, exc)
                connection.close(APP_REFUSED, "the first message was not a hello")
            else:
                self._rejected(cid, exc)
            return
        if cid is None:
            self._hello(connection, session, msg)
            return
        if msg.kind == "data" and session.state is State.OPEN:  # receive's Data, unmade
            self._delivered(cid, msg)
        elif reason := self._received(cid, session, msg):  # a bye
            connection.close(APP_CLOSED, reason)
            connection.close_reason = reason
            self._ended(connection, session)

    def _send_now(self, connection: Connection, enc: EncodedMessage) -> None:
        connection.submit(SendJob.of(enc))

    def _hello(self, connection: Connection, session: HubSession, msg: Message) -> None:
        who = connection.who
        try:
            session = self._sessions[connection] = HubSession(
                **self._session_options(), tls_name=self._check_certificate(connection)
            )
            event = session.receive(msg)
        except SessionRefused as exc:
            self._send_now(connection, session.refusal(exc))
            self._refused(who, exc)
            self._close_after_flush(connection, APP_REFUSED, str(exc))
            return
        if not isinstance(event, Joined):
            log.debug("quic: %s: first message %s", who, event)
            return
        hello = session.hello
        assert hello is not None
        cid = hello.client_id
        connection.limits = self.limits
        connection.hello_only = False
        self._waiting.remove(connection)
        with self._lock:
            old = self._peers.get(cid)
            self._peers[cid] = connection
        if old is not None and old is not connection:
            log.info("quic: client %r reconnected from %s; closing its old connection", cid, who)
            old.close(APP_REPLACED, "replaced by a new connection of the same client")
            self._sessions.pop(old, None)
        replaced = self._member_from(hello, connection)
        self._send_now(connection, session.welcome())
        self._announce_member(cid, replaced)

    def _close_after_flush(self, connection: Connection, code: int, reason: str) -> None:
        """Close once what was queued on ``connection`` is acknowledged (a refusal must
        arrive), or after :data:`BYE_TIMEOUT`; :meth:`_tick` does it."""
        connection.close_later = (code, reason, time.monotonic() + BYE_TIMEOUT)

    # -- the template's --------------------------------------------------------------------

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        with self._lock:
            connection = self._peers.get(client_id)
        if connection is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        self._engine.run_send(connection, enc, deadline)

    def _close_transport(self) -> None:
        with self._lock:
            connections = list(self._peers.values())
        goodbye = bye("the hub is closing")
        for connection in connections:
            self._engine.call(functools.partial(self._send_now, connection, goodbye))
        self._engine.flush(connections, BYE_TIMEOUT)
        self._engine.close(
            lambda: list(self._sessions), APP_CLOSED, "the hub is closing", BYE_TIMEOUT
        )
        self._engine.stop()

    def quic_stats(self) -> dict[str, dict[str, int]]:
        """Per connected client: packets sent, packets declared lost and probe timeouts
        (aioquic's loss recovery) on its connection so far."""
        with self._lock:
            return {cid: connection.stats for cid, connection in self._peers.items()}
