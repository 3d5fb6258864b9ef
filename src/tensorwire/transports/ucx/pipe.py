"""One ``ucx://`` connection: a UCX endpoint's byte stream carrying tensorwire messages.

Reads are exact: the :class:`~tensorwire.wire.MessageStream` says where its next bytes belong
(the prefix, the header, then each tensor's own array) and a UCX ``stream_recv`` of exactly
that many bytes lands them there, so an uncompressed tensor is received in place, with no
staging copy. A read that times out stays posted and the next read takes it up, so a deadline
never loses bytes. With a session key (:meth:`UcxPipe.seal`) both directions travel in sealed
records (:mod:`.records`) and a record is opened into the stream instead.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from tensorwire.codecs import get_codec
from tensorwire.errors import PeerGone, TransportError
from tensorwire.transports.ucx.records import Records
from tensorwire.transports.ucx.workers import array, wait
from tensorwire.wire import NEED_DATA, EncodedMessage, Limits, Message, MessageStream
from tensorwire.wire.encoder import SEGMENT_BYTES
from tensorwire.wire.format import PREFIX, PREFIX_SIZE

COALESCE_BYTES = 64 << 10
"""Pieces of a message smaller than this go in one UCX send (one request, not several)."""
STAGING_BYTES = 64 << 10
"""A message up to this size (prefix included) is read in two UCX reads into a staging buffer."""
LINGER_S = 0.25
"""Seconds a side that answered a bye waits for the peer to close first
(:meth:`UcxPipe.linger`)."""
ABORT_WAIT_NS = 10**9
"""Nanoseconds the close of a failed endpoint waits for the progress thread (each step)."""
_EXACT = 1 << 62  # MessageStream's largest read: the whole of each piece, in one request


class UcxPipe:
    """Messages over one UCX endpoint. One thread reads; sends are serialised by
    :attr:`send_lock` (hold it and call :meth:`send_locked`, or call :meth:`send`)."""

    def __init__(self, endpoint: Any, limits: Limits) -> None:
        self.endpoint = endpoint
        self.stream = MessageStream(limits=limits, codec_lookup=get_codec, max_read=_EXACT)
        self.send_lock = threading.Lock()
        self._post_lock = threading.Lock()  # posting requests, and closing
        self.records: Records | None = None
        self.closed = False
        self._pending: tuple[Any, Any] | None = None  # a read posted, and its buffer
        self._record_body = 0  # sealed bytes of the record being read (0: its head next)
        self._staging = memoryview(bytearray(STAGING_BYTES))
        self._rest: int | None = None  # bytes of a small message after its prefix, once read

    def seal(self, session_key: bytes, *, hub: bool) -> None:
        """From now on, seal what is sent and open what is received (see :mod:`.records`)."""
        self.records = Records(session_key, hub=hub)

    # -- receiving --------------------------------------------------------------------------

    def read_message(self, deadline: float | None) -> Message:
        """The next whole message; ``WireError`` for a bad one, :class:`PeerGone` when the
        connection is lost, ``TransportTimeout`` at ``deadline`` (resumed by the next call)."""
        stream = self.stream
        while True:
            event = stream.next_event()
            if event is not NEED_DATA:
                return event
            if self.records is not None:
                self._read_record(deadline)
                continue
            if not stream.in_message:
                msg = self._read_start(deadline)
                if msg is not None:
                    return msg
                continue
            dst = stream.next_buffer()
            self._read_exact(dst, deadline)
            stream.advance(len(dst))

    def _read_start(self, deadline: float | None) -> Message | None:
        """A message begins: its prefix, then, when the whole message fits the staging buffer,
        all the rest at once (two UCX reads for a small message, decoded in one pass); a
        larger one goes on through the stream's phases, in place."""
        staging = self._staging
        if self._rest is None:
            self._read_exact(staging[:PREFIX_SIZE], deadline)
            header_length, body_length = PREFIX.unpack_from(staging)[4::2]
            if PREFIX_SIZE + header_length + body_length > len(staging):
                self.stream.receive_data(staging[:PREFIX_SIZE])  # checks it, against limits
                return None
            self._rest = header_length + body_length
        end = PREFIX_SIZE + self._rest
        if self._rest:
            self._read_exact(staging[PREFIX_SIZE:end], deadline)
        self._rest = None
        return self.stream.receive_one(staging[:end])

    def _read_record(self, deadline: float | None) -> None:
        records = self.records
        assert records is not None
        if not self._record_body:
            self._read_exact(memoryview(records.head), deadline)
            self._record_body = records.body_size()
        sealed = memoryview(records.sealed)[: self._record_body]
        self._read_exact(sealed, deadline)
        self._record_body = 0
        self.stream.receive_data(records.open(sealed))

    def _read_exact(self, dst: memoryview, deadline: float | None) -> None:
        if self._pending is None:
            self._pending = (self._post(self.endpoint.stream_recv, dst, "receive"), dst)
        try:
            wait(self._pending[0], deadline, "receive", self.endpoint)
        except PeerGone:
            self._pending = None
            raise
        self._pending = None

    def _post(self, operation: Any, buf: Any, what: str) -> Any:
        """Post a UCX request on the endpoint, unless it is closed (never both at once: a
        request posted on a closed endpoint is a crash, not an error)."""
        with self._post_lock:
            if self.closed:
                raise PeerGone("the connection is closed")
            try:
                return operation(array(buf))
            except Exception as exc:  # ucxx's errors: the endpoint is gone
                raise PeerGone(f"UCX {what} failed: {exc}") from None

    def linger(self, seconds: float) -> None:
        """After answering the peer's bye: wait until the peer closes (a read fails), at most
        ``seconds``, so the answer is read before this side's close drops it. Whatever else
        comes is dropped."""
        deadline = time.monotonic() + seconds
        with contextlib.suppress(TransportError):
            while True:
                self._read_exact(self._staging[:1], deadline)

    # -- sending ----------------------------------------------------------------------------

    def send(self, enc: EncodedMessage, deadline: float | None) -> None:
        """Send a whole message by ``deadline``; on failure the connection is unusable."""
        with self.send_lock:
            self.send_locked(enc, deadline)

    def send_locked(self, enc: EncodedMessage, deadline: float | None) -> None:
        """:meth:`send`, by a thread that holds :attr:`send_lock`."""
        batches = [enc.frames()] if enc.nbytes <= SEGMENT_BYTES else enc.segments()
        requests = []  # all posted before any is waited for: UCX moves one while the next is made
        for batch in batches:
            pieces = self.records.seal(batch) if self.records else _coalesced(batch)
            requests += [(self._post(self.endpoint.stream_send, p, "send"), p) for p in pieces]
        for request, _ in requests:  # the pieces stay referenced until sent
            wait(request, deadline, "send")

    def close(self) -> None:
        """Close the endpoint (a read or send in progress ends with :class:`PeerGone`)."""
        with self._post_lock:
            if self.closed:
                return
            self.closed = True
        with contextlib.suppress(Exception):
            if self.endpoint.alive:
                self.endpoint.close()  # flushes what was sent first, on the progress thread
            else:  # failed (the peer is gone): close() on it crashes; ucxx itself aborts it
                self.endpoint.close_blocking(period=ABORT_WAIT_NS, max_attempts=1)


def _coalesced(batch: Any) -> list[Any]:
    """The non-empty pieces of ``batch``, runs of small ones joined into one."""
    out: list[Any] = []
    small: list[memoryview] = []
    for buf in batch:
        view = memoryview(buf).cast("B")
        if not len(view):
            continue
        if len(view) < COALESCE_BYTES:
            small.append(view)
            continue
        if small:
            out.append(small[0] if len(small) == 1 else b"".join(small))
            small = []
        out.append(view)
    if small:
        out.append(small[0] if len(small) == 1 else b"".join(small))
    return out


def send_closing(pipe: UcxPipe, enc: EncodedMessage, deadline: float | None) -> None:
    """Send a control message on a connection about to close, if it can go by ``deadline``."""
    with contextlib.suppress(TransportError):
        pipe.send(enc, deadline)
