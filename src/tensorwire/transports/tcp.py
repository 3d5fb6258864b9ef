"""``tcp://host:port``: one TCP connection per client, messages back to back on it.

A client opens with a ``hello`` message (its id and the codecs it decodes), the hub answers
``welcome`` (the codecs it decodes); then both send ``data`` messages, and ``bye`` to close.
Each connection has its own reader thread on the hub; sends use ``sendmsg`` scatter-gather.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from tensorwire.codecs import get_codec
from tensorwire.errors import PeerGone, TransportError, TransportTimeout, WireError
from tensorwire.transports.base import (
    PROTOCOL_VERSION,
    Channel,
    Hub,
    control_message,
    deadline_after,
    default_client_id,
    parse_hello,
)
from tensorwire.transports.stream_socket import StreamReader, send_encoded
from tensorwire.transports.url import host_port
from tensorwire.wire import EncodedMessage, Limits, Message, MessageStream

log = logging.getLogger("tensorwire.transports.tcp")

HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to say hello
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before closing anyway


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed or never connected
        sock.shutdown(socket.SHUT_RDWR)


@dataclass(eq=False)
class _Peer:
    client_id: str
    reader: socket.socket
    writer: socket.socket  # a dup, so send timeouts do not disturb the reader thread
    send_lock: threading.Lock

    def close(self) -> None:
        _shutdown(self.reader)
        self.writer.close()
        self.reader.close()


class TcpHub(Hub):
    """Hub listening on ``tcp://host:port`` (port 0 picks a free one; see :attr:`url`)."""

    protocol = "tcp"

    def __init__(self, url: str, *, backlog: int = 128, **options: Any) -> None:
        super().__init__(**options)
        host, port = host_port(url, default_port=0)
        self._lsock = socket.create_server((host, port), backlog=backlog)
        self.url = f"tcp://{host}:{self._lsock.getsockname()[1]}"
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
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
            _tune(conn)
            t = threading.Thread(
                target=self._serve_connection,
                args=(conn, addr),
                name=f"tensorwire-tcp-{addr}",
                daemon=True,
            )
            self._threads.append(t)
            t.start()

    def _serve_connection(self, conn: socket.socket, addr: Any) -> None:
        reader = StreamReader(conn, MessageStream(limits=self.limits, codec_lookup=get_codec))
        try:
            cid, decoders = parse_hello(reader.read_message(deadline_after(HANDSHAKE_TIMEOUT)))
            send_encoded(
                conn,
                control_message(
                    "welcome", {"decoders": self.decoders, "version": PROTOCOL_VERSION}
                ),
            )
        except (WireError, TransportError) as exc:
            log.warning("tcp: refused connection from %s: %s", addr, exc)
            _shutdown(conn)
            conn.close()
            return
        peer = _Peer(cid, conn, conn.dup(), threading.Lock())
        with self._lock:
            old = self._peers.get(cid)
            self._peers[cid] = peer
        if old is not None:
            log.info("tcp: client %r reconnected from %s; closing its old connection", cid, addr)
            old.close()
        self._joined(cid, decoders, session=peer)
        reason = self._read_loop(peer, reader)
        with self._lock:
            current = self._peers.get(cid) is peer
            if current:
                del self._peers[cid]
        peer.close()
        if current:
            self._left(cid, reason, session=peer)

    def _read_loop(self, peer: _Peer, reader: StreamReader) -> str:
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
            if msg.kind == "data":
                self._delivered(peer.client_id, msg)
            elif msg.kind == "bye":
                return "said goodbye"
            else:
                log.debug("tcp: ignoring %r message from %r", msg.kind, peer.client_id)

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        with self._lock:
            peer = self._peers.get(client_id)
        if peer is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        with peer.send_lock:
            try:
                send_encoded(peer.writer, enc, deadline)
            except TransportError:
                _shutdown(peer.reader)  # a half-sent message leaves the stream unusable
                raise

    def _close_transport(self) -> None:
        _shutdown(self._lsock)
        self._lsock.close()
        self._accepting.join(timeout=5)
        with self._lock:
            peers = list(self._peers.values())
        bye = control_message("bye", {})
        for peer in peers:
            with peer.send_lock, contextlib.suppress(TransportError, OSError):
                send_encoded(peer.writer, bye, deadline_after(BYE_TIMEOUT))
            _shutdown(peer.reader)
        for t in self._threads:
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
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self.client_id = client_id or default_client_id()
        self._address = host_port(url)
        self._send_lock = threading.Lock()
        self._closed = True
        self.reconnect(timeout)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)dial the hub and say hello with the same client id."""
        if not self._closed:
            self._drop()
        deadline = deadline_after(timeout)
        delay = 0.02
        while True:
            try:
                sock = socket.create_connection(self._address, timeout=timeout)
                break
            except OSError as exc:  # hub not up yet: keep trying until the deadline
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise TransportTimeout(
                        f"could not connect to {self.url} within {timeout} s: {exc}"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        _tune(sock)
        self._rsock, self._wsock = sock, sock.dup()
        self._reader = StreamReader(
            self._rsock, MessageStream(limits=self.limits, codec_lookup=get_codec)
        )
        self._closed = False
        try:
            hello = {
                "client_id": self.client_id,
                "decoders": self.decoders,
                "version": PROTOCOL_VERSION,
            }
            send_encoded(self._wsock, control_message("hello", hello), deadline)
            welcome = self._reader.read_message(deadline)
        except (WireError, TransportError):
            self._drop()
            raise
        if welcome.kind != "welcome":
            self._drop()
            raise TransportError(f"hub at {self.url} answered {welcome.kind!r} instead of welcome")
        self.hub_decoders = frozenset(welcome.meta.get("decoders", []))

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        with self._send_lock:
            try:
                send_encoded(self._wsock, enc, deadline)
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
            if msg.kind == "data":
                return msg
            if msg.kind == "bye":
                self._drop()
                raise PeerGone(f"hub at {self.url} closed the session")

    def _drop(self) -> None:
        self._closed = True
        _shutdown(self._rsock)
        self._wsock.close()
        self._rsock.close()

    def close(self) -> None:
        """Say goodbye to the hub and close the connection."""
        if self._closed:
            return
        with self._send_lock, contextlib.suppress(TransportError, OSError):
            send_encoded(self._wsock, control_message("bye", {}), deadline_after(BYE_TIMEOUT))
        self._drop()
