"""A client's end of ``quic://host:port``: one QUIC connection to the hub, on the UDP socket
and I/O thread that this process's channels to that hub share (:mod:`.endpoint`)."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from tensorwire.errors import AuthenticationError, PeerGone, WireError
from tensorwire.transports.base import (
    BYE_TIMEOUT,
    Channel,
    ChannelOptions,
    Inbox,
    deadline_after,
    remaining,
)
from tensorwire.transports.quic.compat import TunedQuicConnection
from tensorwire.transports.quic.connection import APP_CLOSED, Arrival, Connection
from tensorwire.transports.quic.endpoint import ClientEndpoint, dial
from tensorwire.transports.quic.messages import decode_stream
from tensorwire.transports.quic.settings import HANDSHAKE_TIMEOUT, parse_quic_url
from tensorwire.transports.quic.tls import channel_configuration
from tensorwire.transports.session import ClientSession, State, Welcomed, bye
from tensorwire.transports.url import host_port
from tensorwire.wire import EncodedMessage, Message

FLUSH_TIMEOUT = 5.0
"""Seconds ``close`` waits for what it sent to be acknowledged before closing anyway."""


class QuicChannel(Channel):
    """A client's QUIC connection to a :class:`QuicHub`; dials for ``timeouts.connect``
    seconds."""

    protocol = "quic"
    link_timed_by_acks = True  # a send returns once its bytes are with the connection

    def __init__(self, url: str, options: ChannelOptions) -> None:
        super().__init__(url, options)
        self._settings = parse_quic_url(url)
        self._address = host_port(url)
        self._endpoint: ClientEndpoint | None = None
        self.reconnect()

    def _open(self, deadline: float | None) -> Welcomed:
        """One attempt: a QUIC handshake with the hub, our hello and its welcome."""
        host, port = self._address
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        conn = TunedQuicConnection(
            configuration=channel_configuration(self._settings, self.tls, host)
        )
        inbox = Inbox()

        def deliver(connection: Connection, item: Arrival) -> None:
            inbox.put(item)

        def closed(connection: Connection) -> None:
            inbox.fail(connection.close_error or PeerGone("the connection is closed"))

        connection = Connection(conn, addr, client_side=True, limits=self.limits, deliver=deliver)
        connection.on_acked = self._note_link
        connection.on_closed = closed
        endpoint = dial(family, addr, connection, self._settings.ping_every)
        try:
            left = remaining(deadline)
            attempt = HANDSHAKE_TIMEOUT if left is None else min(left, HANDSHAKE_TIMEOUT)
            if not connection.handshake_done.wait(attempt) or connection.closed.is_set():
                error = connection.close_error
                if isinstance(error, AuthenticationError):
                    raise error
                raise PeerGone(
                    f"no QUIC handshake with {self.url}: {connection.close_reason or 'no answer'}"
                )
            self._endpoint, self._connection, self._inbox = endpoint, connection, inbox
            session = self._client_session(f"the hub at {self.url}")
            endpoint.engine.run_send(connection, session.hello(), deadline)
            welcome = session.receive(self._next_raw(deadline, None))
        except BaseException:
            self._endpoint = None
            endpoint.close(connection, APP_CLOSED, "connecting failed", BYE_TIMEOUT)
            raise
        assert isinstance(welcome, Welcomed)
        self._session: ClientSession = session
        return welcome

    def _next_raw(self, deadline: float | None, out: Any) -> Message:
        """The next message from the hub, decoded here (into ``out`` where it fits)."""
        while True:
            item = self._inbox.get(deadline)
            if item is None:
                continue  # the hub gave up on a send
            if isinstance(item, WireError):
                raise item
            return decode_stream(item, self.limits, out)

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed or self._endpoint is None:
            raise PeerGone("channel is closed; call reconnect()")
        self._endpoint.engine.run_send(self._connection, enc, deadline)

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        while True:
            try:
                msg = self._next_raw(deadline, out)
            except WireError as exc:
                self._rejected(exc)
                continue
            except PeerGone:
                self._drop()
                raise
            session = self._session  # open-session data first: receive's Data, unmade
            if (msg.kind == "data" and session.state is State.OPEN) or self._is_data(session, msg):
                return msg

    def quic_stats(self) -> dict[str, int]:
        """Packets sent, packets declared lost and probe timeouts on this connection."""
        return self._connection.stats

    def _say_goodbye(self) -> None:
        """Say goodbye, then wait for what was sent to be acknowledged (for at most
        :data:`FLUSH_TIMEOUT`): closing a QUIC connection discards what is still unacked."""
        with contextlib.suppress(OSError):
            self._send_encoded(bye(), deadline_after(BYE_TIMEOUT))
        if self._endpoint is not None:
            self._endpoint.engine.flush([self._connection], FLUSH_TIMEOUT)

    def _drop(self) -> None:
        """Close the connection at once; idempotent."""
        endpoint = self._endpoint
        if endpoint is None:
            return
        self._endpoint = None
        connection = self._connection
        connection.log_stats(f"{self.client_id}: connection closed")
        endpoint.close(connection, APP_CLOSED, "the client is closing", BYE_TIMEOUT)
