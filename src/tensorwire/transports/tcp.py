"""``tcp://host:port``: one TCP connection per client, messages back to back on it.

With ``tls=tensorwire.TLS(...)`` the connection opens with a TLS 1.3 handshake (``ssl``), mutual
when the hub's settings name a CA (the certificate's name is then checked against the hello's
client id), and then carries AES-128-OCB3 records under keys agreed inside TLS
(``docs/transports/tcp.md``).

The session (``docs/session.md``) maps onto the connection directly: the client's first
message is its ``hello``, the hub answers ``welcome`` (or ``refuse`` and closes); then both
send ``data`` messages, and ``bye`` before closing. Each connection has its own reader thread
on the hub; sends use ``sendmsg`` scatter-gather from the caller's thread. The socket stays
blocking (see :mod:`~tensorwire.transports.stream_socket`), so a send's deadline never
disturbs the reader.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any, cast

from tensorwire.codecs import get_codec
from tensorwire.errors import PeerGone, SessionRefused, TransportError, WireError
from tensorwire.transports.base import (
    Channel,
    Hub,
    deadline_after,
    default_client_id,
    dial,
    remaining,
)
from tensorwire.transports.security import TLS, peer_common_name
from tensorwire.transports.session import (
    HELLO_LIMITS,
    Closed,
    Data,
    HubSession,
    Welcomed,
    bye,
)
from tensorwire.transports.stream_socket import StreamReader, send_encoded, wrap_tls
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import EncodedMessage, Limits, Message, MessageStream

log = logging.getLogger("tensorwire.transports.tcp")

HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to say hello
MAX_HANDSHAKES = 64  # connections at once that have not said hello; more are closed at once
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye (or why not) before closing anyway


def _tune(sock: socket.socket) -> None:
    sock.settimeout(None)  # blocking: deadlines are per call (poll), never the socket's mode
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed or never connected
        sock.shutdown(socket.SHUT_RDWR)


def _say(sock: socket.socket, enc: EncodedMessage) -> None:
    """Send a control message on a connection about to close, if it can go in time."""
    with contextlib.suppress(TransportError, OSError):
        send_encoded(sock, enc, deadline_after(BYE_TIMEOUT))


@dataclass(eq=False)
class _Peer:
    client_id: str
    sock: socket.socket
    send_lock: threading.Lock


class TcpHub(Hub):
    """Hub listening on ``tcp://host:port`` (port 0 picks a free one; see :attr:`url`)."""

    protocol = "tcp"

    def __init__(self, url: str, *, backlog: int = 128, **options: Any) -> None:
        super().__init__(**options)
        query_options(url, ())
        host, port = host_port(url, default_port=0)
        self._ssl = None if self.tls is None else self.tls.server_context()
        self._lsock = socket.create_server((host, port), backlog=backlog)
        self.url = f"tcp://{host}:{self._lsock.getsockname()[1]}"
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._accepting = threading.Thread(
            target=self._accept_loop, name="tensorwire-tcp-accept", daemon=True
        )
        self._accepting.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, addr = self._lsock.accept()
            except OSError:
                return  # listening socket shut down by close()
            with self._lock:
                crowded = len(self._threads) - len(self._peers) >= MAX_HANDSHAKES
            if crowded:  # a flood of silent connections must not cost a thread each
                self._refused(f"{addr[0]}:{addr[1]}", TransportError("too many handshakes"))
                conn.close()
                continue
            _tune(conn)
            t = threading.Thread(
                target=self._serve_connection,
                args=(conn, addr),
                name=f"tensorwire-tcp-{addr}",
                daemon=True,
            )
            with self._lock:
                self._threads.add(t)
            t.start()

    def _handshake(self, conn: socket.socket) -> tuple[socket.socket, HubSession, StreamReader]:
        deadline = deadline_after(HANDSHAKE_TIMEOUT)
        tls_name = None
        if self._ssl is not None:
            # a TlsStream stands in for the socket: stream_socket's functions take either
            conn = cast(
                socket.socket, wrap_tls(conn, self._ssl, server_side=True, deadline=deadline)
            )
            tls_name = peer_common_name(conn)
        reader = StreamReader(conn, MessageStream(limits=HELLO_LIMITS, codec_lookup=get_codec))
        session = HubSession(**self._session_options(), tls_name=tls_name)
        try:
            session.receive(reader.read_message(deadline))
        except SessionRefused as exc:
            _say(conn, session.refusal(exc))
            raise
        reader.stream.limits = self.limits  # a member: its messages may be as large as ours
        return conn, session, reader

    def _serve_connection(self, conn: socket.socket, addr: Any) -> None:
        try:
            conn, session, reader = self._handshake(conn)
        except (WireError, TransportError) as exc:
            self._refused(f"{addr[0]}:{addr[1]}", exc)
            _shutdown(conn)
            conn.close()
            with self._lock:
                self._threads.discard(threading.current_thread())
            return
        hello = session.hello
        assert hello is not None
        cid = hello.client_id
        peer = _Peer(cid, conn, threading.Lock())
        # A member before its welcome goes out (a client that has its welcome can count on the
        # hub knowing its codecs and limits), and no other send reaches it before the welcome.
        unwelcome = None
        with peer.send_lock:
            with self._lock:
                old = self._peers.get(cid)
                self._peers[cid] = peer
            if old is not None:
                log.info("tcp: client %r reconnected from %s; closing its old one", cid, addr)
                _shutdown(old.sock)
            replaced = self._make_member(
                cid, hello.decoders, session=peer, max_message_bytes=hello.max_message_bytes
            )
            try:
                send_encoded(conn, session.welcome(), deadline_after(HANDSHAKE_TIMEOUT))
            except TransportError as exc:
                unwelcome = f"the welcome could not be sent: {exc}"
        self._announce_member(cid, replaced)
        reason = unwelcome or self._read_loop(peer, reader, session)
        with self._lock:
            current = self._peers.get(cid) is peer
            if current:
                del self._peers[cid]
            self._threads.discard(threading.current_thread())
        _shutdown(conn)
        with peer.send_lock:  # a send still running on this socket finishes (with PeerGone)
            conn.close()
        if current:
            self._left(cid, reason, session=peer)

    def _read_loop(self, peer: _Peer, reader: StreamReader, session: HubSession) -> str:
        """Deliver the peer's messages until it leaves; return why it left."""
        while True:
            try:
                msg = reader.read_message()
            except WireError as exc:
                self._rejected(peer.client_id, exc)
                if reader.stream.broken:
                    return f"sent bytes that are not a tensorwire message ({exc})"
                continue
            except TransportError as exc:
                return str(exc)
            event = session.receive(msg)
            if isinstance(event, Data):
                self._delivered(peer.client_id, msg)
            elif isinstance(event, Closed):
                return event.reason
            else:
                log.debug("tcp: %r: %s", peer.client_id, event)

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        with self._lock:
            peer = self._peers.get(client_id)
        if peer is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        with peer.send_lock:
            try:
                send_encoded(peer.sock, enc, deadline)
            except TransportError:
                _shutdown(peer.sock)  # a half-sent message leaves the stream unusable
                raise

    def _close_transport(self) -> None:
        _shutdown(self._lsock)
        self._lsock.close()
        self._accepting.join(timeout=5)
        with self._lock:
            peers = list(self._peers.values())
            threads = list(self._threads)
        goodbye = bye("the hub is closing")
        for peer in peers:
            if peer.send_lock.acquire(timeout=BYE_TIMEOUT):
                try:
                    _say(peer.sock, goodbye)
                finally:
                    peer.send_lock.release()
            _shutdown(peer.sock)
        for t in threads:
            t.join(timeout=5)


class TcpChannel(Channel):
    """A client's connection to a :class:`TcpHub`; retries connecting for ``timeout`` seconds."""

    protocol = "tcp"

    def __init__(
        self,
        url: str,
        *,
        client_id: str | None = None,
        codec: Any = "auto",
        checksum: bool = True,
        limits: Limits = Limits(),
        timeout: float = 30.0,
        tls: TLS | None = None,
        key: Any = None,
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self.client_id = client_id or default_client_id()
        query_options(url, ())
        self._address = host_port(url)
        self._credentials(tls, key)
        self._ssl = None if tls is None else tls.client_context()
        self._send_lock = threading.Lock()
        self._closed = True
        self.reconnect(timeout)

    def _open(self, deadline: float | None) -> tuple[socket.socket, StreamReader, Welcomed]:
        sock = socket.create_connection(self._address, timeout=remaining(deadline))
        _tune(sock)
        if self._ssl is not None:
            assert self.tls is not None
            name = self.tls.server_name or self._address[0]
            sock = cast(  # a TlsStream stands in for the socket, as in _handshake
                socket.socket,
                wrap_tls(
                    sock, self._ssl, server_side=False, server_hostname=name, deadline=deadline
                ),
            )
        session = self._client_session(f"the hub at {self.url}")
        reader = StreamReader(sock, MessageStream(limits=self.limits, codec_lookup=get_codec))
        try:
            send_encoded(sock, session.hello(), deadline)
            welcome = session.receive(reader.read_message(deadline))
        except BaseException:
            sock.close()
            raise
        assert isinstance(welcome, Welcomed)
        self._session = session
        return sock, reader, welcome

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)dial the hub and say hello with the same client id."""
        if not self._closed:
            self._drop()
        sock, reader, welcome = dial(self._open, what=self.url, timeout=timeout)
        self._sock, self._reader = sock, reader
        self.hub_decoders = welcome.decoders
        self.hub_max_bytes = welcome.max_message_bytes
        self._closed = False

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        with self._send_lock:
            try:
                send_encoded(self._sock, enc, deadline)
            except TransportError:
                self._drop()  # a half-sent message leaves the stream unusable
                raise

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        while True:
            if not self._reader.stream.in_message:
                self._reader.stream.set_out(out)
            try:
                msg = self._reader.read_message(deadline)
            except WireError:
                if self._reader.stream.broken:
                    self._drop()
                raise
            except PeerGone:
                self._drop()
                raise
            event = self._session.receive(msg)
            if isinstance(event, Data):
                return msg
            if isinstance(event, Closed):
                self._drop()
                raise self._session.closed_error()

    def _drop(self) -> None:
        self._closed = True
        _shutdown(self._sock)
        self._sock.close()

    def close(self) -> None:
        """Say goodbye to the hub and close the connection."""
        if self._closed:
            return
        with self._send_lock:
            _say(self._sock, bye())
        self._drop()
