"""The channel: a client's end of one connection to a hub.

A transport's channel implements four methods: :meth:`Channel._open` (one attempt to reach
the hub, up to its welcome), :meth:`Channel._send_encoded`, :meth:`Channel._recv_message` and
:meth:`Channel._drop` (let go of the connection). Dialling with a deadline and backoff,
reconnecting, saying goodbye, codecs, records and streams are here.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

from tensorwire.errors import TransportError, TransportTimeout
from tensorwire.transports.base.dialling import deadline_after, default_client_id, dial
from tensorwire.transports.base.endpoint import _Endpoint, _out_by_path
from tensorwire.transports.base.logs import _log_limited, log
from tensorwire.transports.base.options import ChannelOptions
from tensorwire.transports.base.records import TransferRecord
from tensorwire.transports.base.send_time import timed_send
from tensorwire.transports.security import TLS
from tensorwire.transports.session import ClientSession, Closed, Data, Welcomed, bye
from tensorwire.transports.streams import (
    ACK_KEY,
    DEFAULT_WINDOW,
    StreamBatch,
    StreamResult,
    ack_fields,
    receive_stream,
    send_stream,
    stream_fields,
)
from tensorwire.transports.url import redacted
from tensorwire.wire import EncodedMessage, Message

BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before letting go anyway
MAX_HELD = 10_000  # a channel's messages kept while a stream waits for acknowledgements


class Channel(_Endpoint, ABC):
    """The client side: one connection to a hub. Use as a context manager."""

    options_type: ClassVar[type[ChannelOptions]] = ChannelOptions
    """The options this transport's channels take (``connect``'s keywords become one)."""

    url: str
    client_id: str
    hub_decoders: frozenset[str]
    hub_max_bytes: int | None = None  # the largest message the hub accepts (its welcome)
    tls: TLS | None = None
    secret: bytes | None = None  # this client's enrolled secret, proven in every hello
    _call_timeout: float | None = None
    _closed = True

    options: ChannelOptions

    def __init__(self, url: str, options: ChannelOptions) -> None:
        super().__init__(options.codec, options.checksum, options.limits)
        self.url = url
        self.options = options
        self.client_id = options.client_id or default_client_id()
        self.tls = options.credentials.tls
        self.secret = options.credentials.secret
        self._call_timeout = options.timeouts.call
        self._closed = True

    # -- what a transport implements ------------------------------------------------------

    @abstractmethod
    def _open(self, deadline: float | None) -> Welcomed:
        """One attempt to reach the hub by ``deadline``: connect, hello, its welcome; keeps
        what it opened on the channel. ``OSError`` is retried by :meth:`reconnect`;
        ``SessionRefused`` is final."""

    @abstractmethod
    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        """Send one encoded message to the hub by ``deadline`` (``time.monotonic()``)."""

    @abstractmethod
    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        """The next message from the hub (data or a session message), decoded into ``out``
        where it fits; ``TransportTimeout`` at ``deadline``; ``PeerGone`` if the hub left."""

    @abstractmethod
    def _drop(self) -> None:
        """Let go of the connection at once, without a goodbye; never raises."""

    def _say_goodbye(self) -> None:
        """Tell the hub this session ends (best effort: a hub that is gone is not waited for)."""
        with contextlib.suppress(OSError):
            self._send_encoded(bye(), deadline_after(BYE_TIMEOUT))

    # -- the template ---------------------------------------------------------------------

    def reconnect(self, timeout: float | None = None) -> None:
        """(Re)dial the hub and say hello with the same client id, in a new session, retrying
        with backoff for ``timeout`` seconds (default: the options' ``timeouts.connect``)."""
        if not self._closed:
            self._drop()
            self._closed = True
        welcome = dial(
            self._open,
            what=f"the hub at {redacted(self.url)}",
            timeout=self.options.timeouts.connect if timeout is None else timeout,
        )
        self.hub_decoders = welcome.decoders
        self.hub_max_bytes = welcome.max_message_bytes
        self._closed = False

    def close(self) -> None:
        """Say goodbye to the hub and let go of the connection."""
        if self._closed:
            return
        try:
            self._say_goodbye()
        finally:
            self._drop()
            self._closed = True

    def _is_data(self, session: ClientSession, msg: Message) -> bool:
        """True if ``msg`` is data for the caller; else act on it: on the hub's bye, drop the
        connection and raise why; log the rest. A transport may take open-session data itself
        first (kind "data", session OPEN), to save a call per message."""
        event = session.receive(msg)
        if isinstance(event, Data):
            return True
        if isinstance(event, Closed):
            self._drop()
            raise session.closed_error()
        log.debug("%s: from the hub at %s: %s", self.protocol, redacted(self.url), event)
        return False

    def _rejected(self, exc: Exception) -> None:
        """Something on this channel's medium was not a valid message from the hub: counted in
        :attr:`errors`, logged (rate-limited), never raised from ``recv``."""
        self.errors.append(("hub", exc))
        _log_limited(
            f"channel {self.client_id} {type(exc).__name__}",
            f"{self.protocol}: {self.client_id}: dropped a message not from the hub: {exc}",
        )

    def _client_session(self, where: str, **hello_meta: Any) -> ClientSession:
        """A fresh session for one connection attempt, with this channel's settings."""
        return ClientSession(
            self.client_id,
            decoders=self.decoders,
            max_message_bytes=self.limits.max_message_bytes,
            hello_meta=hello_meta,
            where=where,
            secret=self.secret,
        )

    def send(
        self,
        tensors: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> TransferRecord:
        """Send one message to the hub; return its transfer record."""
        started = time.perf_counter()
        enc = self._encode_for(
            tensors, meta, self.hub_decoders, peer_max_bytes=self.hub_max_bytes, peer="the hub"
        )
        if timeout is None:
            timeout = self._call_timeout
        deadline = None if timeout is None else time.monotonic() + timeout  # deadline_after
        sent = timed_send(lambda: self._send_encoded(enc, deadline), self._measures_link(enc))
        return self._note_send("hub", enc, sent, started)

    def recv(
        self, timeout: float | None = None, *, out: Mapping[Any, Any] | None = None
    ) -> Message:
        """The next message from the hub.

        ``out`` (nested like the message, or keyed by name-path tuples) holds arrays to decode
        into where dtype, shape and order match; others get new arrays.
        """
        if self._stream_held:
            return self._stream_held.popleft()
        deadline = deadline_after(self._call_timeout if timeout is None else timeout)
        while True:
            msg = self._next_from_hub(deadline, _out_by_path(out))
            if msg is not None:
                return msg

    def _next_from_hub(self, deadline: float | None, out: Any = None) -> Message | None:
        """The next message from the hub, or None when it was a stream acknowledgement
        (noted for :meth:`send_many`)."""
        msg = self._recv_message(deadline, out)
        self._note_recv("hub", msg)
        ack = ack_fields(msg.meta) if msg.meta else None
        if ack is None:
            return msg
        self._acks.note("hub", *ack)
        return None

    def _hold_for_recv(self, msg: Message) -> None:
        """Keep a message that came while a stream waited, for the next ``recv``."""
        if len(self._stream_held) >= MAX_HELD:
            raise TransportError(
                f"the hub sent {MAX_HELD} messages nobody received while a stream waited: "
                "call recv(), or stream with a larger window"
            )
        self._stream_held.append(msg)

    def send_many(
        self,
        batches: Iterable[Any],
        *,
        window: int = DEFAULT_WINDOW,
        timeout: float | None = None,
    ) -> StreamResult:
        """Send ``batches`` (mappings of tensors, or ``(tensors, meta)`` pairs) to the hub as
        a stream: at most ``window`` unconsumed at once, so a hub that stops consuming stops
        this sender (``TransportTimeout`` after ``timeout`` seconds without progress).
        Returns when the hub's :meth:`Hub.stream` has consumed the last batch."""

        def wait_acked(sid: str, n: int, deadline: float | None) -> bool:
            while self._acks.acked("hub", sid) < n:
                try:
                    msg = self._next_from_hub(deadline)
                except TransportTimeout:
                    return False
                if msg is not None:
                    self._hold_for_recv(msg)
            return True

        def start(tensors: Mapping[str, Any] | None, meta: Mapping[str, Any]) -> Any:
            record = self.send(tensors, meta, timeout=timeout)
            return record.bytes_encoded, lambda: record

        return send_stream(
            start,
            wait_acked,
            batches,
            window=window,
            timeout=timeout,
            peer="the hub",
        )

    def stream(self, *, timeout: float | None = None) -> Iterator[StreamBatch]:
        """Iterate over the next stream the hub sends with :meth:`Hub.send_many`, batch by
        batch, until its end; ``timeout`` bounds the wait for each batch. Other messages stay
        queued for ``recv``."""

        def next_message(deadline: float | None, sid: str | None) -> Message:
            for i, held in enumerate(self._stream_held):
                fields = stream_fields(held.meta)
                if fields is not None and (sid is None or fields[0] == sid):
                    del self._stream_held[i]
                    return held
            while True:
                msg = self._next_from_hub(deadline)
                if msg is None:
                    continue
                fields = stream_fields(msg.meta)
                if fields is not None and (sid is None or fields[0] == sid):
                    return msg
                self._hold_for_recv(msg)

        def send_ack(sid: str, n: int) -> None:
            self.send(None, {ACK_KEY: [sid, n]}, timeout=timeout)

        yield from receive_stream(next_message, send_ack, timeout=timeout)

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
