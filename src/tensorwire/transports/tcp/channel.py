"""The ``tcp://`` channel: one connection to the hub, read and written by the caller's thread."""

from __future__ import annotations

import socket
import threading
from typing import Any

from tensorwire.codecs import get_codec
from tensorwire.errors import PeerGone, TransportError, WireError
from tensorwire.transports.base import Channel, deadline_after, default_client_id, dial
from tensorwire.transports.security import TLS
from tensorwire.transports.session import Closed, Data, State, Welcomed, bye
from tensorwire.transports.sockets import (
    StreamReader,
    connect_stream,
    send_before_close,
    send_encoded,
    shutdown,
)
from tensorwire.transports.tcp.hub import BYE_TIMEOUT
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import EncodedMessage, Limits, Message, MessageStream


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
        server_name = None if self.tls is None else self.tls.server_name
        sock = connect_stream(self._address, deadline, self._ssl, server_name)
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
            if msg.kind == "data" and self._session.state is State.OPEN:  # receive's Data
                return msg
            event = self._session.receive(msg)
            if isinstance(event, Data):
                return msg
            if isinstance(event, Closed):
                self._drop()
                raise self._session.closed_error()

    def _drop(self) -> None:
        self._closed = True
        shutdown(self._sock)
        self._sock.close()

    def close(self) -> None:
        """Say goodbye to the hub and close the connection."""
        if self._closed:
            return
        with self._send_lock:
            send_before_close(self._sock, bye(), deadline_after(BYE_TIMEOUT))
        self._drop()
