"""The ``tcp://`` channel: one connection to the hub, read and written by the caller's thread."""

from __future__ import annotations

import threading
from typing import Any

from tensorwire.codecs import get_codec
from tensorwire.errors import PeerGone, TransportError, WireError
from tensorwire.transports.base import Channel, ChannelOptions
from tensorwire.transports.session import State, Welcomed
from tensorwire.transports.sockets import StreamReader, connect_stream, send_encoded, shutdown
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import EncodedMessage, Message, MessageStream


class TcpChannel(Channel):
    """A client's connection to a :class:`TcpHub`; dials for ``timeouts.connect`` seconds."""

    protocol = "tcp"

    def __init__(self, url: str, options: ChannelOptions) -> None:
        super().__init__(url, options)
        query_options(url, ())
        self._address = host_port(url)
        self._ssl = None if self.tls is None else self.tls.client_context()
        self._send_lock = threading.Lock()
        self.reconnect()

    def _open(self, deadline: float | None) -> Welcomed:
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
        self._sock, self._reader, self._session = sock, reader, session
        return welcome

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
            session = self._session  # open-session data first: receive's Data, unmade
            if (msg.kind == "data" and session.state is State.OPEN) or self._is_data(session, msg):
                return msg

    def _drop(self) -> None:
        self._closed = True  # at once: a send or read that failed drops the connection too
        shutdown(self._sock)
        self._sock.close()
