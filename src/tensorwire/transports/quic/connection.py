"""One QUIC connection and the messages on it: peer streams in, in order; ours out, paced
by acknowledgements. Used by the I/O thread only (:mod:`.engine`)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from aioquic.quic import events
from aioquic.quic.connection import QuicConnection

from tensorwire.errors import AuthenticationError, PeerGone, TransportError, WireError
from tensorwire.transports.quic.compat import (
    count_and_tune_recovery,
    stream_done,
    unacked_bytes,
)
from tensorwire.transports.quic.messages import IncomingMessage, SendJob
from tensorwire.wire import PREFIX_SIZE, Limits
from tensorwire.wire.format import parse_prefix

log = logging.getLogger("tensorwire.transports.quic")

SEND_AHEAD = 8 << 20
"""Bytes of one message handed to the QUIC connection ahead of the peer's acknowledgements."""
MAX_HELD = 1024
"""Messages one connection may have complete but waiting behind an earlier stream."""
APP_CLOSED = 0  # application error codes in CONNECTION_CLOSE
APP_REPLACED = 1
APP_REFUSED = 2
APP_CANCELLED = 3  # RESET_STREAM: a send gave up on its deadline
_CRYPTO_ERROR = 0x100  # + the TLS alert
_CERT_ALERTS = {42, 43, 44, 45, 46, 48, 49, 116}

Arrival = list[bytes] | WireError | None
"""What a peer stream brought: its raw bytes (a list of chunks), a :class:`WireError` (it
broke the limits or was cut short), or None (the sender reset it: a send that gave up)."""
Deliver = Callable[["Connection", Arrival], None]


def _nothing() -> None:
    """What waking a connection does before an engine serves it."""


class Connection:
    """One QUIC connection and the messages on it (used by the I/O thread only).

    ``deliver(connection, arrival)`` gets each peer stream's message in stream order."""

    def __init__(
        self,
        conn: QuicConnection,
        addr: Any,
        *,
        client_side: bool,
        limits: Limits,
        deliver: Deliver,
    ) -> None:
        self.conn = conn
        self.addr = addr
        self.limits = limits
        self.deliver = deliver
        self.client_side = client_side
        # the peer's unidirectional streams: 2, 6, 10 ... from a client; 3, 7 ... from the hub
        self.next_sid = 3 if client_side else 2
        self.hello_only = not client_side  # a hub's peer: its first stream only, until joined
        self._incoming: dict[int, IncomingMessage] = {}
        self._ready: dict[int, Arrival] = {}
        self._dead: set[int] = set()  # peer streams given up on: their late data is dropped
        self.jobs: deque[SendJob] = deque()
        self.unacked: set[int] = set()  # our streams the peer has not acknowledged in full
        # a message's bytes and when it was submitted, by stream, until the peer acknowledged
        # it all: then on_acked(bytes, seconds) tells the link's rate (a send returns once
        # its bytes are with the connection, up to SEND_AHEAD ahead of the link)
        self._submitted: dict[int, tuple[int, float]] = {}
        self.on_acked: Callable[[int, float], None] | None = None
        # told once the TLS handshake is complete (on the I/O thread)
        self.on_handshake: Callable[[Connection], None] | None = None
        self.handshake_done = threading.Event()
        self.closed = threading.Event()
        # told once, when the connection closes, either end's doing (on the I/O thread)
        self.on_closed: Callable[[Connection], None] | None = None
        self.close_reason = ""
        self.close_error: TransportError | None = None
        self.created = time.monotonic()
        self.last_ping = time.monotonic()
        self.close_later: tuple[int, str, float] | None = None  # code, reason, by when
        self.recovery = count_and_tune_recovery(conn)
        self.cids: set[bytes] = set()  # our connection ids its engine routes to it
        # tells its engine it has something to send (set by ``Engine.add``)
        self.wake: Callable[[], None] = _nothing

    @property
    def who(self) -> str:
        """The peer's address, ``host:port``."""
        return f"{self.addr[0]}:{self.addr[1]}"

    @property
    def stats(self) -> dict[str, int]:
        """Packets sent, packets declared lost and probe timeouts so far."""
        return self.recovery.as_dict()

    def log_stats(self, who: str) -> None:
        r = self.recovery
        log.info(
            "quic: %s: %d packets sent, %d lost, %d probe timeouts",
            who,
            r.sent_packets,
            r.lost_packets,
            r.pto,
        )

    def ping_if_quiet(self, now: float, every: float) -> None:
        """Ping the peer when nothing was pinged for ``every`` seconds (a keep-alive)."""
        if now - self.last_ping > every:
            self.last_ping = now
            self.conn.send_ping(0)
            self.wake()

    # -- events from the connection --------------------------------------------------

    def handle(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            self._on_data(event.stream_id, event.data, event.end_stream)
        elif isinstance(event, events.StreamReset):
            self._give_up(event.stream_id, None)
        elif isinstance(event, events.HandshakeCompleted):
            self.handshake_done.set()
            if self.on_handshake is not None:
                self.on_handshake(self)
        elif isinstance(event, events.StopSendingReceived):
            self._cancel_stream(event.stream_id)
        elif isinstance(event, events.ConnectionTerminated):
            self._terminated(event)

    def _terminated(self, event: events.ConnectionTerminated) -> None:
        reason = event.reason_phrase or f"error 0x{event.error_code:x}"
        if _CRYPTO_ERROR <= event.error_code < _CRYPTO_ERROR + 0x100 and (
            event.error_code - _CRYPTO_ERROR in _CERT_ALERTS
        ):
            self.close_error = AuthenticationError(f"the TLS handshake failed: {reason}")
        elif event.error_code == APP_CLOSED and event.frame_type is None:
            self.close_error = PeerGone(f"the connection was closed ({reason})")
        else:
            self.close_error = PeerGone(f"the connection ended: {reason}")
        self.close_reason = reason
        self._fail_jobs(self.close_error)
        self._set_closed()

    def _fail_jobs(self, exc: Exception) -> None:
        while self.jobs:
            job = self.jobs.popleft()
            job.error = exc
            job.done.set()

    def _peer_stream(self, sid: int) -> bool:
        return sid & 3 == (3 if self.client_side else 2)

    def _on_data(self, sid: int, data: bytes, end: bool) -> None:
        if not self._peer_stream(sid):  # a bidirectional stream: not ours to read
            with contextlib.suppress(Exception):
                self.conn.stop_stream(sid, APP_REFUSED)
            return
        if sid < self.next_sid or sid in self._ready or sid in self._dead:
            return
        if self.hello_only and sid != self.next_sid:  # a stranger may send one message
            self.deliver(self, WireError("a second stream before the hello was answered"))
            return
        rx = self._incoming.get(sid)
        if rx is None:
            rx = self._incoming[sid] = IncomingMessage()
        if data:
            rx.chunks.append(data)
            rx.size += len(data)
        try:
            if rx.total is None and rx.size >= PREFIX_SIZE:
                head = rx.chunks[0]
                if len(head) < PREFIX_SIZE:
                    head = b"".join(rx.chunks)
                prefix = parse_prefix(memoryview(head)[:PREFIX_SIZE], self.limits)
                rx.total = PREFIX_SIZE + prefix.header_length + prefix.body_length
            if rx.total is not None and rx.size > rx.total:
                raise WireError(f"a stream held {rx.size} bytes past its message's {rx.total}")
            if end and rx.size != rx.total:
                raise WireError(
                    f"a message cut short: {rx.size} bytes of {rx.total or 'an unknown size'}"
                )
        except WireError as exc:
            self._give_up(sid, exc)
            with contextlib.suppress(Exception):
                self.conn.stop_stream(sid, APP_REFUSED)
            return
        if end:
            del self._incoming[sid]
            self._complete(sid, rx.chunks)

    def _give_up(self, sid: int, item: WireError | None) -> None:
        if not self._peer_stream(sid) or sid < self.next_sid or sid in self._ready:
            return
        self._incoming.pop(sid, None)
        self._dead.add(sid)
        self._complete(sid, item)

    def _complete(self, sid: int, item: Arrival) -> None:
        self._ready[sid] = item
        if len(self._ready) > MAX_HELD:
            self.close(APP_REFUSED, "too many messages held behind a stream that never came")
            return
        while self.next_sid in self._ready:
            sid = self.next_sid
            item = self._ready.pop(sid)
            self._dead.discard(sid)
            self.next_sid += 4
            self.deliver(self, item)

    # -- sending ---------------------------------------------------------------------

    def submit(self, job: SendJob) -> None:
        if self.closed.is_set():
            job.error = self.close_error or PeerGone("the connection is closed")
            job.done.set()
            return
        job.stream_id = self.conn.get_next_available_stream_id(is_unidirectional=True)
        self.conn.send_stream_data(job.stream_id, b"", end_stream=False)  # opens it: the order
        self.unacked.add(job.stream_id)
        if self.on_acked is not None:
            self._submitted[job.stream_id] = (job.nbytes, time.monotonic())
        self.jobs.append(job)
        self.pump()
        self.wake()

    def cancel(self, job: SendJob) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
            self._cancel_stream(job.stream_id)

    def _cancel_stream(self, sid: int) -> None:
        for job in list(self.jobs):
            if job.stream_id == sid:
                self.jobs.remove(job)
                job.error = PeerGone("the peer stopped reading the message")
                job.done.set()
        self._submitted.pop(sid, None)
        if sid in self.unacked:
            self.unacked.discard(sid)
            with contextlib.suppress(Exception):
                self.conn.reset_stream(sid, APP_CANCELLED)
            self.wake()

    def pump(self) -> None:
        """Hand queued messages to the connection, up to :data:`SEND_AHEAD` unacknowledged
        bytes per stream."""
        for job in list(self.jobs):
            while unacked_bytes(self.conn, job.stream_id) < SEND_AHEAD:
                piece = next(job.pieces, None)
                if piece is None:
                    self.conn.send_stream_data(job.stream_id, b"", end_stream=True)
                    job.written = True
                    break
                # a memoryview: aioquic appends it to a bytearray (typed bytes, takes any buffer)
                self.conn.send_stream_data(job.stream_id, cast(bytes, piece))
            if job.written:
                self.jobs.remove(job)
                job.done.set()
        for sid in list(self.unacked):
            if stream_done(self.conn, sid):
                self.unacked.discard(sid)
                submitted = self._submitted.pop(sid, None)
                if submitted is not None and self.on_acked is not None:
                    self.on_acked(submitted[0], time.monotonic() - submitted[1])

    @property
    def flushed(self) -> bool:
        """Whether everything sent so far has been acknowledged (or cannot be)."""
        return self.closed.is_set() or (not self.jobs and not self.unacked)

    def close(self, code: int, reason: str) -> None:
        if not self.closed.is_set():
            self.conn.close(error_code=code, reason_phrase=reason)
            self.wake()
            self.close_reason = reason
            self.close_error = PeerGone(f"the connection was closed: {reason}")
            self._fail_jobs(self.close_error)
            self._set_closed()

    def _set_closed(self) -> None:
        first = not self.closed.is_set()
        self.closed.set()
        self.handshake_done.set()
        if first and self.on_closed is not None:
            self.on_closed(self)
