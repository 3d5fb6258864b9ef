"""``flight://host:port``: Arrow Flight over gRPC, a session of two ``DoExchange`` calls.

A client opens a session with two calls on one gRPC connection, each used in one direction:

- downlink, path ``tensorwire/down``: the client writes its ``hello`` and half-closes; the
  hub answers ``welcome`` once the uplink is attached too, then writes every message for it;
- uplink, path ``tensorwire/up/<session>``: the client writes its messages, then ``bye``.

Why not one call for both directions: pyarrow's client finishes a call from its reader when
the stream ends, sending a half-close that can race a write in progress in another thread,
which gRPC aborts the process for (``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``). With each call
written by one side only, nothing races. The uplink is an exchange rather than a ``DoPut``
because only an exchange's reader can cancel its call, which a send's deadline and
:meth:`FlightChannel._drop` need. The session ends when either call does, as a TCP
connection would; a ``bye`` is sent down whenever the hub ends it.

On both calls, control messages (``hello``/``welcome``/``bye``, whole wire messages) travel
in the ``app_metadata`` of a FlightData without a batch, so each side acts on them at once.
A data message travels as record batches of one binary column (:data:`SCHEMA`), one value
each, in order: each tensor's buffer is its own batch(es), wrapped by ``pa.py_buffer`` (no
copy; Flight hands it to gRPC as is), with small neighbours (header, digests, small tensors)
joined. No batch holds more than ``batch_bytes`` (4 MiB), far under gRPC's 2 GiB per
message, so any message size goes. The receiver feeds each value (a view of the received
Arrow buffer) to a :class:`~tensorwire.wire.MessageStream`, which copies the tensor bytes
once, straight into the output arrays (``recv(out=...)``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

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
    remaining,
)
from tensorwire.transports.url import host_port
from tensorwire.wire import (
    NEED_DATA,
    EncodedMessage,
    Limits,
    Message,
    MessageStream,
    decode_message,
)

log = logging.getLogger("tensorwire.transports.flight")

SCHEMA = pa.schema([("bytes", pa.binary())])
"""Every data batch: one binary column whose values are consecutive bytes of the messages."""

DOWN = (b"tensorwire", b"down")  # descriptor path of a session's downlink
UP = (b"tensorwire", b"up")  # ... of its uplink, followed by the session id
BATCH_BYTES = 4 << 20  # most message bytes per record batch (one gRPC message)
JOIN_BELOW = 512 << 10  # smaller buffers share a batch: copying them beats a gRPC message each
FEED_BYTES = 256 << 10  # bytes fed to the decoder at a time: it hashes them while in cache
HANDSHAKE_TIMEOUT = 10.0  # seconds a session's second call has to arrive after its first
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before closing anyway
SHUTDOWN_TIMEOUT = 5.0  # seconds the hub waits for its server to stop before leaving it be


def _control(kind: str, meta: dict[str, Any]) -> bytes:
    return control_message(kind, meta).to_bytes()


def _pieces(enc: EncodedMessage, batch_bytes: int) -> Iterator[Any]:
    """``enc`` as buffers of at most ``batch_bytes``: big ones as views, small ones joined."""
    join_below = min(JOIN_BELOW, batch_bytes)
    small: list[Any] = []
    size = 0
    for segment in enc.segments(batch_bytes):  # hashes each big tensor piece by piece
        for buf in segment:
            if len(buf) < join_below:
                if small and size + len(buf) > batch_bytes:
                    yield b"".join(small)
                    small, size = [], 0
                small.append(buf)
                size += len(buf)
                continue
            if small:
                yield b"".join(small)
                small, size = [], 0
            view = memoryview(buf)
            for start in range(0, len(view), batch_bytes):
                yield view[start : start + batch_bytes]
    if small:
        yield b"".join(small)


def _batch(buf: Any) -> pa.RecordBatch:
    """``buf``'s bytes as the one value of a :data:`SCHEMA` batch, without copying them."""
    offsets = pa.py_buffer(np.array([0, len(buf)], np.int32))
    column = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(buf)])
    return pa.RecordBatch.from_arrays([column], schema=SCHEMA)


def _batch_bytes(batch: pa.RecordBatch) -> memoryview:
    """The bytes a received batch carries (its values back to back), as a view of its buffer.

    Raises ``WireError`` if the batch is not of :data:`SCHEMA` or is malformed.
    """
    if batch.num_columns != 1 or batch.column(0).type != pa.binary():
        raise WireError(f"expected batches of one binary column, got schema {batch.schema}")
    column = batch.column(0)
    try:
        column.validate(full=True)  # offsets in bounds before they are used to slice
    except pa.ArrowException as exc:
        raise WireError(f"malformed record batch: {exc}") from None
    if column.null_count:
        raise WireError(f"record batch has {column.null_count} null values")
    _, offsets, data = column.buffers()
    if data is None or not len(column):
        return memoryview(b"")
    bounds = np.frombuffer(offsets, np.int32, count=len(column) + 1, offset=4 * column.offset)
    return memoryview(data).cast("B")[int(bounds[0]) : int(bounds[-1])]


def _feed(stream: MessageStream, batch: pa.RecordBatch) -> None:
    """Feed a received batch's bytes to ``stream``, a cache-sized piece at a time."""
    data = _batch_bytes(batch)
    for start in range(0, len(data), FEED_BYTES):
        stream.receive_data(data[start : start + FEED_BYTES])


# --- hub ---------------------------------------------------------------------------------


@dataclass(eq=False)
class _Job:
    """A message (or a control message's bytes) for a peer's downlink."""

    enc: EncodedMessage | None = None
    control: bytes | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None
    abandoned: bool = False  # its sender timed out: write no more of it
    finished_at: float = 0.0  # time.perf_counter() when written (or failed)


@dataclass(eq=False)
class _Peer:
    """A session: its downlink's job queue and state (guarded by ``lock``)."""

    client_id: str
    decoders: frozenset[str]
    session: str
    jobs: queue.SimpleQueue[_Job | None] = field(default_factory=queue.SimpleQueue)
    lock: threading.Lock = field(default_factory=threading.Lock)
    attached: bool = False  # its uplink arrived (guarded by the hub's session lock)
    gone: str | None = None  # why no more data may be written to it

    def submit(self, job: _Job) -> None:
        with self.lock:
            if self.gone is not None:
                raise PeerGone(f"client {self.client_id!r} is gone: {self.gone}")
            self.jobs.put(job)

    def stop(self, reason: str) -> None:
        """Refuse further data, queue a ``bye`` (once), and let the downlink end."""
        with self.lock:
            if self.gone is not None:
                return
            self.gone = reason
            self.jobs.put(_Job(control=_control("bye", {})))
            self.jobs.put(None)


class _Server(flight.FlightServerBase):
    def __init__(self, hub: FlightHub, location: flight.Location) -> None:
        super().__init__(location)
        self._hub = hub

    def do_exchange(self, context, descriptor, reader, writer) -> None:
        path = tuple(descriptor.path or ())
        if path == DOWN:
            self._hub._serve_downlink(context, reader, writer)
        elif path[:2] == UP and len(path) == 3:
            self._hub._serve_uplink(context, path[2].decode("ascii", "replace"), reader)
        else:
            raise flight.FlightServerError(
                f"unknown descriptor {descriptor!r}: this is a tensorwire hub; "
                "use tensorwire.connect('flight://...')"
            )


class FlightHub(Hub):
    """Hub serving Flight on ``flight://host:port`` (port 0 picks a free one; see :attr:`url`).

    ``batch_bytes`` caps the message bytes per record batch (gRPC message) it sends.
    """

    protocol = "flight"

    def __init__(self, url: str, *, batch_bytes: int = BATCH_BYTES, **options: Any) -> None:
        super().__init__(**options)
        host, port = host_port(url, default_port=0)
        self._batch_bytes = batch_bytes
        self._peers: dict[str, _Peer] = {}  # members, by client id
        self._pending: dict[str, _Peer] = {}  # sessions waiting for their uplink, by id
        self._sessions = threading.Condition()  # guards both dicts and _closing
        self._closing = False
        self._server = _Server(self, flight.Location.for_grpc_tcp(host, port))
        self.url = f"flight://{host}:{self._server.port}"

    # -- a session's two calls, each in a Flight server thread -----------------------------

    def _serve_downlink(
        self,
        context: flight.ServerCallContext,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        """Take the hello, wait for the uplink, join the client, then write its messages."""
        peer = self._read_hello(context, reader)
        if peer is None:
            return
        with self._sessions:
            if self._closing:
                return
            self._pending[peer.session] = peer
            self._sessions.notify_all()
            attached = self._sessions.wait_for(
                lambda: peer.attached or self._closing, HANDSHAKE_TIMEOUT
            )
            self._pending.pop(peer.session, None)
            if not attached or self._closing:
                log.warning("flight: %r opened no uplink in time; session refused", peer.client_id)
                return
            with peer.lock:
                if peer.gone is not None:  # its uplink ended already
                    return
            old = self._peers.get(peer.client_id)
            self._peers[peer.client_id] = peer
        if old is not None:
            log.info("flight: client %r reconnected; ending its old session", peer.client_id)
            old.stop("replaced by a new session")
        self._joined(peer.client_id, peer.decoders, session=peer)
        try:
            writer.begin(SCHEMA)
            writer.write_metadata(
                _control("welcome", {"decoders": self.decoders, "version": PROTOCOL_VERSION})
            )
        except pa.ArrowException as exc:
            self._end(peer, f"downlink broke: {exc}")
        self._write_loop(peer, writer)

    def _read_hello(
        self, context: flight.ServerCallContext, reader: flight.MetadataRecordBatchReader
    ) -> _Peer | None:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return None
        except pa.ArrowException as exc:
            log.warning("flight: session from %s broke before its hello: %s", context.peer(), exc)
            return None
        try:
            if chunk.data is not None or chunk.app_metadata is None:
                raise WireError("a session must open with a hello in app_metadata, not a batch")
            hello = decode_message(chunk.app_metadata, limits=self.limits)
            cid, decoders = parse_hello(hello)
            session = hello.meta.get("session")
            if not isinstance(session, str) or not 0 < len(session) <= 64:
                raise TransportError("hello: 'session' must be an id of 1 to 64 characters")
        except WireError as exc:
            self._rejected(context.peer(), exc)
        except TransportError as exc:
            log.warning("flight: refused session from %s: %s", context.peer(), exc)
        else:
            return _Peer(cid, decoders, session)
        return None

    def _write_loop(self, peer: _Peer, writer: flight.MetadataRecordBatchWriter) -> None:
        """Write the peer's jobs until it is stopped; a failed write ends its session."""
        while (job := peer.jobs.get()) is not None:
            try:
                if job.control is not None:
                    writer.write_metadata(job.control)
                elif peer.gone is not None or job.abandoned:
                    job.error = PeerGone(f"client {peer.client_id!r} is gone: {peer.gone}")
                else:
                    assert job.enc is not None
                    for piece in _pieces(job.enc, self._batch_bytes):
                        if job.abandoned:
                            break
                        writer.write_batch(_batch(piece))
            except pa.ArrowException as exc:
                job.error = PeerGone(f"downlink to client {peer.client_id!r} broke: {exc}")
                self._end(peer, f"downlink broke: {exc}")
            except Exception as exc:  # handed to the sender, which raises it
                job.error = exc
            finally:
                job.finished_at = time.perf_counter()
                job.done.set()

    def _serve_uplink(
        self,
        context: flight.ServerCallContext,
        session: str,
        reader: flight.MetadataRecordBatchReader,
    ) -> None:
        """Attach to the session's downlink, then deliver the client's messages until it leaves."""
        with self._sessions:
            found = self._sessions.wait_for(
                lambda: session in self._pending or self._closing, HANDSHAKE_TIMEOUT
            )
            peer = self._pending.get(session) if found and not self._closing else None
            if peer is not None:
                peer.attached = True
                self._sessions.notify_all()
        if peer is None:
            log.warning("flight: uplink from %s names no open session; refused", context.peer())
            return
        self._end(peer, self._read_loop(peer, context, reader))

    def _read_loop(
        self,
        peer: _Peer,
        context: flight.ServerCallContext,
        reader: flight.MetadataRecordBatchReader,
    ) -> str:
        """Deliver the peer's messages until it leaves; return why it left."""
        stream = MessageStream(limits=self.limits, codec_lookup=get_codec)
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return "its connection broke" if context.is_cancelled() else "ended its stream"
            except pa.ArrowException as exc:
                return f"stream broke: {exc}"
            if chunk.data is None:
                if self._control_kind(peer.client_id, chunk.app_metadata) == "bye":
                    return "said goodbye"
                continue
            try:
                _feed(stream, chunk.data)
            except WireError as exc:  # the byte stream lost its framing: nothing after it is safe
                self._deliver_events(peer.client_id, stream)
                self._rejected(peer.client_id, exc)
                return f"sent bytes that are not a tensorwire message ({exc})"
            self._deliver_events(peer.client_id, stream)

    def _deliver_events(self, client_id: str, stream: MessageStream) -> None:
        """Deliver the messages ``stream`` has completed, and report the bad ones."""
        while True:
            try:
                msg = stream.next_event()
            except WireError as exc:  # one bad message, skipped; the stream goes on
                self._rejected(client_id, exc)
                continue
            if msg is NEED_DATA:
                return
            if msg.kind == "data":
                self._delivered(client_id, msg)
            else:
                log.debug("flight: ignoring %r message from %r", msg.kind, client_id)

    def _control_kind(self, client_id: str, meta: pa.Buffer | None) -> str | None:
        if meta is None:
            return None
        try:
            return decode_message(meta, limits=self.limits).kind
        except WireError as exc:
            self._rejected(client_id, exc)
            return None

    def _end(self, peer: _Peer, reason: str) -> None:
        """End a session (idempotent): it leaves, and its downlink says bye and ends."""
        with self._sessions:
            current = self._peers.get(peer.client_id) is peer
            if current:
                del self._peers[peer.client_id]
        peer.stop(reason)
        if current:
            self._left(peer.client_id, reason, session=peer)

    # -- Hub interface ---------------------------------------------------------------------

    def _submit(self, client_id: str, enc: EncodedMessage) -> tuple[_Peer, _Job]:
        with self._sessions:
            peer = self._peers.get(client_id)
        if peer is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        job = _Job(enc=enc)
        peer.submit(job)
        return peer, job

    def _finish(self, peer: _Peer, job: _Job, deadline: float | None) -> None:
        """Wait for a submitted send; past the deadline, drop its client and raise."""
        if not job.done.wait(remaining(deadline)):
            job.abandoned = True  # its stream may now hold half a message: end the session
            self._end(peer, "a send to it timed out")
            raise TransportTimeout(
                f"sending to {peer.client_id!r} did not finish in time; the client was dropped"
            )
        if job.error is not None:
            raise job.error

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        self._finish(*self._submit(client_id, enc), deadline)

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Queue ``enc`` for every client at once: each downlink thread writes its own copy."""
        started = time.perf_counter()
        results: dict[str, float | Exception] = {}
        submitted = []
        for c in clients:
            try:
                submitted.append((c, *self._submit(c, enc)))
            except PeerGone as exc:
                results[c] = exc
        for c, peer, job in submitted:
            try:
                self._finish(peer, job, deadline)
            except Exception as exc:  # reported per client by broadcast()
                results[c] = exc
            else:
                results[c] = job.finished_at - started
        return results

    def _close_transport(self) -> None:
        with self._sessions:
            self._closing = True
            self._sessions.notify_all()
            peers = list(self._peers.values())
        for peer in peers:  # clients hang up on the bye, which ends their sessions' calls
            peer.stop("the hub closed")
        stopper = threading.Thread(
            target=self._server.shutdown, name="tensorwire-flight-shutdown", daemon=True
        )
        stopper.start()
        stopper.join(SHUTDOWN_TIMEOUT)
        if stopper.is_alive():
            log.warning(
                "flight: sessions of %s did not end within %s s; the server stops when they do",
                self.clients,
                SHUTDOWN_TIMEOUT,
            )


# --- channel -------------------------------------------------------------------------------


@dataclass
class _Ended:
    """Queued after the last batch of a session: why it ended."""

    reason: str


@dataclass(eq=False)
class _Session:
    client: flight.FlightClient
    down: flight.FlightStreamReader
    down_writer: flight.FlightStreamWriter
    up: flight.FlightStreamWriter
    up_call: flight.FlightStreamReader  # never read: it cancels the uplink
    stream: MessageStream
    inbox: queue.SimpleQueue[pa.RecordBatch | _Ended] = field(default_factory=queue.SimpleQueue)
    welcomed: threading.Event = field(default_factory=threading.Event)
    hub_decoders: frozenset[str] | None = None
    unreachable: bool = False  # ended because no hub answered at the address
    thread: threading.Thread | None = None


class FlightChannel(Channel):
    """A client's session with a :class:`FlightHub`; retries reaching it for ``timeout`` seconds.

    ``batch_bytes`` caps the message bytes per record batch (gRPC message) it sends.
    """

    protocol = "flight"

    def __init__(
        self,
        url: str,
        *,
        client_id: str | None = None,
        codec: Any = "auto",
        checksum: bool = True,
        limits: Limits = Limits(),
        timeout: float = 30.0,
        batch_bytes: int = BATCH_BYTES,
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self.client_id = client_id or default_client_id()
        host, port = host_port(url)
        self._location = flight.Location.for_grpc_tcp(host, port)
        self._batch_bytes = batch_bytes
        self._send_lock = threading.RLock()  # the uplink's writer: sends, bye, close
        self._session: _Session | None = None
        self.reconnect(timeout)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)open a session with the hub and say hello with the same client id."""
        self._drop()
        deadline = deadline_after(timeout)
        delay = 0.02
        while True:
            try:
                session = self._open()
            except flight.FlightUnavailableError as exc:  # no hub there (yet)
                ended = str(exc)
            except pa.ArrowException as exc:
                raise TransportError(f"could not open a session with {self.url}: {exc}") from None
            else:
                welcomed = session.welcomed.wait(remaining(deadline))
                if welcomed and session.hub_decoders is not None:
                    self._session = session
                    self.hub_decoders = session.hub_decoders
                    return
                self._close_session(session)
                if not welcomed:
                    raise TransportTimeout(f"no welcome from the hub at {self.url} in {timeout} s")
                ended = _end_reason(session)
                if not session.unreachable:  # a hub answered, and refused us
                    raise TransportError(f"hub at {self.url} ended the session: {ended}")
            if deadline is not None and time.monotonic() + delay > deadline:
                raise TransportTimeout(f"could not reach {self.url} within {timeout} s: {ended}")
            time.sleep(delay)  # hub not up yet: keep trying until the deadline
            delay = min(delay * 2, 0.5)

    def _open(self) -> _Session:
        client = flight.FlightClient(self._location)
        session_id = uuid.uuid4().hex
        try:
            down_writer, down = client.do_exchange(flight.FlightDescriptor.for_path(*DOWN))
            up, up_call = client.do_exchange(flight.FlightDescriptor.for_path(*UP, session_id))
        except pa.ArrowException:
            client.close()
            raise
        hello = {
            "client_id": self.client_id,
            "decoders": self.decoders,
            "version": PROTOCOL_VERSION,
            "session": session_id,
        }
        with contextlib.suppress(pa.ArrowException):  # no hub there: the reader says so
            down_writer.write_metadata(_control("hello", hello))
            down_writer.done_writing()  # before the reader starts: it may then finish the call
            up.begin(SCHEMA)
        s = _Session(
            client,
            down,
            down_writer,
            up,
            up_call,
            MessageStream(limits=self.limits, codec_lookup=get_codec),
        )
        s.thread = threading.Thread(
            target=self._read_loop, args=(s,), name="tensorwire-flight-reader", daemon=True
        )
        s.thread.start()
        return s

    def _read_loop(self, s: _Session) -> None:
        """Queue the hub's batches for :meth:`recv`; act on control messages as they come."""
        reason = "the hub ended the session"
        try:
            while True:
                chunk = s.down.read_chunk()
                if chunk.data is not None:
                    s.inbox.put(chunk.data)
                    continue
                if chunk.app_metadata is None:
                    continue
                try:
                    msg = decode_message(chunk.app_metadata, limits=self.limits)
                except WireError as exc:
                    log.warning("flight: ignoring a bad control message from the hub: %s", exc)
                    continue
                if msg.kind == "welcome" and s.hub_decoders is None:
                    s.hub_decoders = frozenset(msg.meta.get("decoders", []))
                    s.welcomed.set()
                elif msg.kind == "bye":
                    reason = f"the hub at {self.url} closed the session"
                    s.up_call.cancel()  # so the hub's end of the uplink ends too
                    return
        except StopIteration:
            s.up_call.cancel()
        except pa.ArrowException as exc:
            s.unreachable = isinstance(exc, flight.FlightUnavailableError)
            reason = f"the session broke: {exc}"
            s.up_call.cancel()
        finally:
            s.inbox.put(_Ended(reason))
            s.welcomed.set()

    def _live(self) -> _Session:
        if self._session is None:
            raise PeerGone("channel is closed; call reconnect()")
        return self._session

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        s = self._live()
        with self._send_lock:
            timer = None
            expired = threading.Event()  # set before the cancel, so the failed write sees it

            def expire() -> None:
                expired.set()
                s.up_call.cancel()

            if deadline is not None:  # a blocked gRPC write ends only when its call is cancelled
                timer = threading.Timer(remaining(deadline) or 0.0, expire)
                timer.start()
            try:
                for piece in _pieces(enc, self._batch_bytes):
                    s.up.write_batch(_batch(piece))
            except pa.ArrowException as exc:
                self._drop()  # half a message leaves the uplink unusable
                if expired.is_set():
                    raise TransportTimeout(f"send of {enc.nbytes} bytes timed out") from None
                raise PeerGone(f"session with {self.url} broke: {exc}") from None
            finally:
                if timer is not None:
                    timer.cancel()

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        s = self._live()
        while True:
            if not s.stream.in_message:
                s.stream.set_out(out)
            msg = s.stream.next_event()
            if msg is not NEED_DATA:
                if msg.kind == "data":
                    return msg
                continue
            try:
                item = s.inbox.get(timeout=remaining(deadline))
            except queue.Empty:
                raise TransportTimeout("no message from the hub in time") from None
            if isinstance(item, _Ended):
                self._drop()
                raise PeerGone(item.reason)
            try:
                _feed(s.stream, item)
            except WireError:
                self._drop()  # framing is lost with the bytes of a bad batch
                raise

    def _drop(self) -> None:
        """End the session at once, without a goodbye."""
        s, self._session = self._session, None
        if s is not None:
            self._close_session(s)

    def _close_session(self, s: _Session) -> None:
        s.down.cancel()  # cancels end blocked reads and writes at once
        s.up_call.cancel()
        if s.thread is not None:
            s.thread.join(timeout=5)
        with self._send_lock:
            for closable in (s.down_writer, s.up, s.client):
                with contextlib.suppress(pa.ArrowException):
                    closable.close()

    def close(self) -> None:
        """Say goodbye to the hub and end the session."""
        s = self._session
        if s is None:
            return
        with self._send_lock, contextlib.suppress(pa.ArrowException):
            s.up.write_metadata(_control("bye", {}))
            s.up.done_writing()
        if s.thread is not None:
            s.thread.join(BYE_TIMEOUT)  # the hub ends the downlink on our bye
        self._drop()


def _end_reason(s: _Session) -> str:
    """Why a session that was not welcomed ended (the reader thread's last word)."""
    while True:
        try:
            item = s.inbox.get_nowait()
        except queue.Empty:
            return "no welcome in time"
        if isinstance(item, _Ended):
            return item.reason
