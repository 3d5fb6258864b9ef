"""Forming the direct links of a group: every rank listens, dials every lower rank and is
dialled by every higher one; a connection proves it belongs with the group's token.

A dialler sends a hello (its rank and the token the rendezvous gave out) and waits for the
listener's welcome. The listener admits a hello with the right token from a rank it has not
admitted yet and refuses anything else (garbage, silence past the handshake deadline, a
wrong token, a second connection from one rank): the connection is closed, the refusal
recorded and logged, and the group goes on. The listener stays up for the group's life.
In a secured group both ends run TLS first, and the hello and the welcome carry each rank's
proof of which rank it is (:mod:`~tensorwire.collective.link`).
"""

from __future__ import annotations

import hmac
import socket
import time
from collections.abc import Collection
from typing import Any

from tensorwire.collective import messages
from tensorwire.collective.connection import RankConnection
from tensorwire.collective.link import LinkSecurity
from tensorwire.collective.state import GroupState
from tensorwire.errors import AuthenticationError, RankFailed, SessionRefused, TransportError
from tensorwire.transports.sockets import (
    Listener,
    StreamReader,
    connect_stream,
    send_encoded,
    shutdown,
    tune,
)
from tensorwire.wire import Limits, MessageStream

HANDSHAKE_S = 10.0
"""Seconds a connection to a rank's listener has to prove it belongs to the group."""

Admitted = tuple[int, socket.socket, StreamReader]


def listen(host: str) -> socket.socket:
    """A listening socket on ``host`` and a port the kernel picks."""
    return socket.create_server((host, 0), backlog=128)


def _handshake_reader(sock: socket.socket) -> StreamReader:
    return StreamReader(sock, MessageStream(limits=messages.HANDSHAKE_LIMITS))


def _opened(reader: StreamReader, limits: Limits) -> StreamReader:
    """``reader``, its limits raised to a member's once the handshake is done."""
    reader.stream.limits = limits
    return reader


class Mesh:
    """The links of ``state``'s rank to every other rank (see the module doc)."""

    def __init__(
        self,
        state: GroupState,
        token: str,
        heartbeat: float,
        limits: Limits,
        security: LinkSecurity | None = None,
    ) -> None:
        self._state = state
        self._token = token
        self._security = security or LinkSecurity(state.rank, token, None)
        self._heartbeat = heartbeat
        self._limits = limits
        self._listener: Listener[Admitted] | None = None
        self.dialers: frozenset[int] = frozenset()  # the ranks that may dial this one

    def open(
        self,
        sock: socket.socket,
        addresses: list[tuple[str, int]],
        deadline: float,
        peers: Collection[int] | None = None,
        dialers: Collection[int] | None = None,
    ) -> None:
        """Accept the higher ranks on ``sock`` (listening), dial the lower ones at their
        ``addresses``; return once every link is up, ``RankFailed`` naming a missing rank
        at ``deadline``. ``peers`` (default every other rank) and ``dialers`` (default the
        higher ones among them) are for an elastic group's rank that rejoins."""
        state = self._state
        others = set(range(state.size)) - {state.rank} if peers is None else set(peers)
        higher = [p for p in others if p > state.rank]
        self.dialers = frozenset(higher if dialers is None else dialers)
        self._listener = Listener(
            sock,
            name=f"rank-{state.rank}-listener",
            handshake=self._admit,
            serve=self._serve,
            refused=state.refused,
        )
        for peer in sorted(others - self.dialers):
            self._dial(peer, addresses[peer], deadline)
        with state.lock:
            while not others <= set(state.connections):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = min(others - set(state.connections))
                    raise RankFailed(missing, f"did not connect to rank {state.rank} in time")
                state.changed.wait(left)

    def dial(self, peer: int, address: tuple[str, int], deadline: float) -> None:
        """Link to rank ``peer`` at ``address`` now (an elastic group's rejoining rank)."""
        self._dial(peer, address, deadline)

    def _dial(self, peer: int, address: tuple[str, int], deadline: float) -> None:
        state = self._state
        shake = self._security.dialling(peer)
        try:
            sock = shake.secure(connect_stream(address, deadline), deadline)
        except OSError as exc:
            raise RankFailed(
                peer, f"rank {state.rank} cannot reach it at {address}: {exc}"
            ) from None
        try:
            send_encoded(sock, shake.hello(), deadline)
            # a member's limits at once: the welcome may come with the peer's first messages
            reader = StreamReader(sock, MessageStream(limits=self._limits))
            reply = reader.read_message(deadline)
            if reply.kind != messages.WELCOME or reply.meta.get("rank") != peer:
                raise SessionRefused(f"answered {reply.kind!r}, not a welcome from rank {peer}")
            shake.check(reply)
        except (OSError, ValueError) as exc:
            sock.close()
            raise RankFailed(peer, f"did not welcome rank {state.rank}: {exc}") from None
        state.add_connection(
            RankConnection(peer, sock, _opened(reader, self._limits), state, self._heartbeat)
        )

    def _admit(self, conn: socket.socket, address: Any) -> Admitted:
        """The handshake of a connection to the listener (the kit's Listener thread)."""
        state = self._state
        tune(conn)
        deadline = time.monotonic() + HANDSHAKE_S
        conn = self._security.accept(conn, deadline)
        reader = _handshake_reader(conn)
        hello = reader.read_message(deadline)
        token = hello.meta.get("token")
        if hello.kind != messages.HELLO or not isinstance(token, str):
            raise SessionRefused(f"sent {hello.kind!r} where a rank's hello was due")
        if not hmac.compare_digest(token.encode(), self._token.encode()):
            raise AuthenticationError("its hello does not carry this group's token")
        peer = hello.meta.get("rank")
        with state.lock:
            if not isinstance(peer, int) or peer not in self.dialers:
                raise SessionRefused(f"claims rank {peer!r}, which does not dial rank {state.rank}")
            if peer in state.connections:
                raise SessionRefused(f"claims rank {peer}, which is connected already")
        auth = self._security.admit(hello, peer, conn)
        try:
            send_encoded(conn, messages.welcome(state.rank, auth), deadline)
        except OSError as exc:
            raise TransportError(f"the welcome did not go out: {exc}") from None
        return peer, conn, reader

    def _serve(self, admitted: Admitted) -> None:
        peer, sock, reader = admitted
        state = self._state
        with state.lock:
            if peer in state.connections:  # two hellos from one rank raced through the handshake
                state.refused(str(peer), SessionRefused(f"rank {peer} connected twice"))
                shutdown(sock)
                sock.close()
                return
            opened = _opened(reader, self._limits)
            state.add_connection(RankConnection(peer, sock, opened, state, self._heartbeat))

    def close(self, timeout: float) -> None:
        """Stop listening; say bye on every link and close it."""
        if self._listener is not None:
            self._listener.close()
        conns = list(self._state.connections.values())
        deadline = time.monotonic() + timeout
        for conn in conns:  # every link's last words first, then wait for their ends
            conn.end_sending(deadline)
        for conn in conns:
            conn.close(timeout)
