"""The ``ucx://`` channel: one UCX endpoint to the hub, read and written by the caller's thread."""

from __future__ import annotations

import contextlib
from typing import Any

from tensorwire.errors import PeerGone, TransportError, WireError
from tensorwire.transports.base import BYE_TIMEOUT, Channel, ChannelOptions, deadline_after
from tensorwire.transports.session import State, Welcomed, bye
from tensorwire.transports.ucx.pipe import LINGER_S, UcxPipe, send_closing
from tensorwire.transports.ucx.settings import UcxSettings
from tensorwire.transports.ucx.workers import start_worker, stop_worker, ucx_api
from tensorwire.transports.url import host_port
from tensorwire.wire import EncodedMessage, Message


class UcxChannel(Channel):
    """A client's connection to a :class:`UcxHub`; dials for ``timeouts.connect`` seconds.
    ``key=`` (its enrolled secret) is proven in the hello and seals the session's bytes;
    ``tls=`` is accepted and not used (UCX has no TLS)."""

    protocol = "ucx"

    def __init__(self, url: str, options: ChannelOptions) -> None:
        super().__init__(url, options)
        self._settings = UcxSettings.from_url(url)
        self._address = host_port(url)
        self._worker = start_worker(self._settings)
        try:
            self.reconnect()
        except BaseException:
            stop_worker(self._worker)
            raise

    def _open(self, deadline: float | None) -> Welcomed:
        host, port = self._address
        try:
            endpoint = ucx_api().UCXEndpoint.create(self._worker, host, port, True)
        except Exception as exc:  # ucxx's errors: nobody there (yet)
            raise PeerGone(f"cannot reach ucx://{host}:{port}: {exc}") from None
        pipe = UcxPipe(endpoint, self.limits)
        session = self._client_session(f"the hub at {self.url}")
        try:
            pipe.send(session.hello(), deadline)
            welcome = session.receive(pipe.read_message(deadline))
        except BaseException:
            pipe.close()
            raise
        assert isinstance(welcome, Welcomed)
        if session.key is not None:
            pipe.seal(session.key, hub=False)
        self._pipe, self._session = pipe, session
        return welcome

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        try:
            self._pipe.send(enc, deadline)
        except TransportError:
            self._drop()  # a half-sent message leaves the stream unusable
            raise

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        stream = self._pipe.stream
        while True:
            if not stream.in_message:
                stream.set_out(out)
            try:
                msg = self._pipe.read_message(deadline)
            except WireError:
                if stream.broken:
                    self._drop()
                raise
            except PeerGone:
                self._drop()
                raise
            session = self._session  # open-session data first: receive's Data, unmade
            if msg.kind == "bye" and session.state is State.OPEN:
                send_closing(self._pipe, bye(), deadline_after(BYE_TIMEOUT))  # (see the hub)
                self._pipe.linger(LINGER_S)
            if (msg.kind == "data" and session.state is State.OPEN) or self._is_data(session, msg):
                return msg

    def close(self) -> None:
        """Say goodbye to the hub, let go of the connection and stop this channel's worker."""
        try:
            super().close()
        finally:
            stop_worker(self._worker)

    def _say_goodbye(self) -> None:
        """Say bye, then wait (up to ``BYE_TIMEOUT``) for the hub's: the hub has then read
        all this channel sent before closing drops what UCX still holds."""
        deadline = deadline_after(BYE_TIMEOUT)
        send_closing(self._pipe, bye(), deadline)
        with contextlib.suppress(TransportError, WireError):
            while self._pipe.read_message(deadline).kind != "bye":
                pass

    def _drop(self) -> None:
        self._closed = True  # at once: a send or read that failed drops the connection too
        self._pipe.close()
