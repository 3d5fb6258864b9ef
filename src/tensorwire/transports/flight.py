"""``flight://host:port``: Arrow Flight over gRPC, a session of two ``DoExchange`` calls.

``docs/transports/flight.md`` specifies the layout; in short, a client opens two calls on one
gRPC connection, each written by one side only:

- downlink, a descriptor of type CMD whose command is the client's ``hello``: the hub
  answers ``welcome`` (or ``refuse``) once the uplink is attached, then writes every message
  for the client;
- uplink, path ``tensorwire/up/<session>`` (the hello's ``session``): the client writes its
  messages, then ``bye``.

Why two calls: pyarrow's client finishes a call from its reader when the stream ends,
sending a half-close that can race a write in progress in another thread, which gRPC aborts
the process for (``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``). With each call written by one
side only, nothing races. The uplink is an exchange rather than a ``DoPut`` because only an
exchange's reader can cancel its call, which a send's deadline and
:meth:`FlightChannel._drop` need. The hello rides in the descriptor, which Flight reads
before it calls the hub, so no hub thread ever waits for a stranger to speak. The session
ends when either call does, as a TCP connection would; a ``bye`` goes down whenever the hub
ends it.

Control messages (``welcome``/``refuse``/``bye``, whole wire messages) travel in the
``app_metadata`` of a FlightData without a batch, so each side acts on them at once. A data
message travels as record batches of one binary column (:data:`SCHEMA`), one value each, in
order: each tensor's buffer is its own batch(es), wrapped by ``pa.py_buffer`` (no copy;
Flight hands it to gRPC as is), with small neighbours (header, digests, small tensors)
joined. No batch holds more than ``batch_bytes`` (4 MiB), far under gRPC's 2 GiB per
message, so any message size goes. The receiver feeds each value (a view of the received
Arrow buffer) to a :class:`~tensorwire.wire.MessageStream`, which copies the tensor bytes
once, straight into the output arrays (``recv(out=...)``).

With ``tls=tensorwire.TLS(...)`` (or the URL options ``?tls=1``, ``?ca=`` ...) both calls run
over gRPC's TLS (``grpc+tls``), mutual when the hub's settings name a CA; the hub then takes
the client certificate's name from gRPC (``ServerCallContext.peer_identity()``) and checks it
against the hello's client id. ``key=`` / ``auth=`` add the session's secret proof
(``docs/security.md``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from tensorwire.codecs import get_codec
from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    SessionRefused,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.base import (
    Channel,
    Hub,
    Inbox,
    deadline_after,
    default_client_id,
    dial,
    remaining,
)
from tensorwire.transports.security import TLS
from tensorwire.transports.session import (
    HELLO_LIMITS,
    ClientSession,
    Closed,
    Data,
    Hello,
    HubSession,
    bye,
)
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import (
    EncodedMessage,
    Limits,
    Message,
    MessageStream,
    decode_message,
)

log = logging.getLogger("tensorwire.transports.flight")

FLIGHT_ERRORS = (pa.ArrowException, OSError)
"""What a Flight call raises when its call fails: Flight's errors, or a bare ``OSError``
("server disconnect?")."""

SCHEMA = pa.schema([("bytes", pa.binary())])
"""Every data batch: one binary column whose values are consecutive bytes of the messages."""

UP = (b"tensorwire", b"up")  # descriptor path of a session's uplink, followed by its id
BATCH_BYTES = 4 << 20  # most message bytes per record batch (one gRPC message)
JOIN_BELOW = 512 << 10  # smaller buffers share a batch: copying them beats a gRPC message each
FEED_BYTES = 256 << 10  # bytes fed to the decoder at a time: it hashes them while in cache
HANDSHAKE_TIMEOUT = 10.0  # seconds a session's second call has to arrive after its first
MAX_HANDSHAKES = 64  # calls at once waiting for their session's other call; more are refused
POLL_S = 0.25  # seconds between checks that a waiting call was not cancelled
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before closing anyway
SHUTDOWN_TIMEOUT = 5.0  # seconds the hub waits for its server to stop before leaving it be


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


def _feed(stream: MessageStream, batch: pa.RecordBatch) -> Message | None:
    """Feed a received batch's bytes to ``stream``, a cache-sized piece at a time; return the
    message when the batch is one whole message of at most ``FEED_BYTES`` that starts where
    the stream is at a message's start (decoded in one pass: :meth:`MessageStream.receive_one`),
    else None (the stream's events say what the bytes completed)."""
    data = _batch_bytes(batch)
    if len(data) <= FEED_BYTES:
        return stream.receive_one(data)
    for start in range(0, len(data), FEED_BYTES):
        stream.receive_data(data[start : start + FEED_BYTES])
    return None


def _control(meta: pa.Buffer, limits: Limits) -> Message:
    """The whole message an ``app_metadata`` carries; ``WireError`` if it is none."""
    return decode_message(meta, limits=limits, codec_lookup=get_codec)


def _who(context: flight.ServerCallContext) -> str:
    """The caller's address without its port ("ipv4:127.0.0.1"): one key per host, so that
    a flood of calls from one host is logged as one."""
    return context.peer().rpartition(":")[0] or context.peer()


def _tls_name(context: flight.ServerCallContext) -> str | None:
    """The name on the caller's verified TLS certificate (gRPC's peer identity: its first
    subject alternative name if it has any, else its common name), or None without one."""
    name = context.peer_identity()
    return name.decode("utf-8", "replace") if name else None


def _pem(path: Any) -> bytes:
    """The bytes of a PEM file a :class:`TLS` names (gRPC takes them, not paths)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TransportError(f"cannot read the TLS file {path}: {exc}") from None


def _server_tls(tls: TLS) -> dict[str, Any]:
    """``FlightServerBase`` arguments for a hub with ``tls``: its certificate, and the CA
    whose client certificates it requires (mutual TLS) when ``tls.ca`` is set."""
    tls.server_context()  # no cert= or key=, or files ssl cannot load: said here, clearly
    ca = None if tls.ca is None else _pem(tls.ca)
    return {
        "tls_certificates": [flight.CertKeyPair(_pem(tls.cert), _pem(tls.key))],
        "verify_client": ca is not None,
        "root_certificates": ca,
    }


def _client_tls(tls: TLS) -> dict[str, Any]:
    """``FlightClient`` arguments for a channel with ``tls``: the CA that signs the hub's
    certificate (None: the system's), the name it must carry, this client's own certificate."""
    # gRPC would report a bad file only when it connects, as an unreachable hub, which the
    # channel retries until its timeout: ssl loads them once here and says what is wrong.
    tls.client_context()
    options: dict[str, Any] = {"override_hostname": tls.server_name}
    if tls.ca is not None:
        options["tls_root_certs"] = _pem(tls.ca)
    if tls.cert is not None and tls.key is not None:
        options["cert_chain"] = _pem(tls.cert)
        options["private_key"] = _pem(tls.key)
    return options


def _unreachable(url: str, exc: Exception) -> TransportError:
    """What a channel raises when gRPC found no hub at ``url``: :class:`AuthenticationError`
    (final) when TLS failed on a certificate (the hub's does not verify, or it refused ours),
    else a ``TransportError`` worth retrying."""
    text = str(exc)
    # gRPC reports TLS failures only as text: "Ssl handshake failed ...: certificate verify
    # failed" (or "... signature failure", "... bad certificate"), "Peer name X is not in
    # peer certificate"
    if "is not in peer certificate" in text or (
        "handshake failed" in text and "certificate" in text
    ):
        return AuthenticationError(f"TLS with the hub at {url} failed on a certificate: {text}")
    return TransportError(f"no hub answers at {url}: {text}")


def _location(host: str, port: int, tls: TLS | None) -> flight.Location:
    if tls is None:
        return flight.Location.for_grpc_tcp(host, port)
    return flight.Location.for_grpc_tls(host, port)


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
    """A session: its hello, its session machine, and its downlink's job queue and state
    (guarded by ``lock``)."""

    hello: Hello
    session: HubSession
    tls_name: str | None  # its downlink's certificate name: its uplink must carry the same
    jobs: queue.SimpleQueue[_Job | None] = field(default_factory=queue.SimpleQueue)
    lock: threading.Lock = field(default_factory=threading.Lock)
    attached: bool = False  # its uplink arrived (guarded by the hub's session lock)
    gone: str | None = None  # why no more data may be written to it

    @property
    def client_id(self) -> str:
        return self.hello.client_id

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
            self.jobs.put(_Job(control=bye(reason).to_bytes()))
            self.jobs.put(None)


class _Server(flight.FlightServerBase):
    def __init__(self, hub: FlightHub, location: flight.Location, **tls: Any) -> None:
        super().__init__(location, **tls)
        self._hub = hub

    def do_exchange(self, context, descriptor, reader, writer) -> None:
        if descriptor.descriptor_type == flight.DescriptorType.CMD:
            self._hub._serve_downlink(context, descriptor.command, writer)
            return
        path = tuple(descriptor.path or ())
        if len(path) == 3 and path[:2] == UP:
            self._hub._serve_uplink(context, path[2].decode("ascii", "replace"), reader)
            return
        self._hub._refused(_who(context), TransportError(f"unknown descriptor {descriptor!r}"))
        raise flight.FlightServerError(
            f"unknown descriptor {descriptor!r}: this is a tensorwire hub; "
            "use tensorwire.connect('flight://...')"
        )


class FlightHub(Hub):
    """Hub serving Flight on ``flight://host:port`` (port 0 picks a free one; see :attr:`url`).

    ``batch_bytes`` caps the message bytes per record batch (gRPC message) it sends. With
    ``tls=`` it serves gRPC over TLS only (mutual when ``tls.ca`` is set), never plaintext.
    """

    protocol = "flight"

    def __init__(self, url: str, *, batch_bytes: int = BATCH_BYTES, **options: Any) -> None:
        super().__init__(**options)
        query_options(url, ())
        host, port = host_port(url, default_port=0)
        tls = {} if self.tls is None else _server_tls(self.tls)
        self._batch_bytes = batch_bytes
        self._peers: dict[str, _Peer] = {}  # members, by client id
        self._pending: dict[str, _Peer] = {}  # sessions waiting for their uplink, by id
        self._handshakes = 0  # calls waiting for their session's other call
        # ids of the latest refused hellos: their uplinks, ending, are the same refusal
        self._refused_ids: collections.deque[str] = collections.deque(maxlen=MAX_HANDSHAKES)
        self._sessions = threading.Condition()  # guards the above and _closing
        self._closing = False
        self._server = _Server(self, _location(host, port, self.tls), **tls)
        self.url = f"flight://{host}:{self._server.port}"

    # -- a session's two calls, each in a Flight server thread -----------------------------

    def _serve_downlink(
        self,
        context: flight.ServerCallContext,
        command: bytes,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        """Take the hello, wait for the uplink, then write the client's messages."""
        who = _who(context)
        with self._handshake(who) as admitted:
            peer = self._open_session(who, context, command, writer) if admitted else None
            if peer is None:
                return
            with contextlib.suppress(*FLIGHT_ERRORS):  # hung up: the wait below sees it
                writer.begin(SCHEMA)
            if not self._await_uplink(who, context, peer):
                return
        self._write_loop(peer, writer)

    @contextlib.contextmanager
    def _handshake(self, who: str) -> Iterator[bool]:
        """Count a call as handshaking while in the block; yields False (refused) when
        :data:`MAX_HANDSHAKES` already are: a flood of calls must not cost a thread each."""
        with self._sessions:
            admitted = self._handshakes < MAX_HANDSHAKES
            self._handshakes += admitted
        if not admitted:
            self._refused(who, TransportError(f"over {MAX_HANDSHAKES} sessions opening at once"))
        try:
            yield admitted
        finally:
            with self._sessions:
                self._handshakes -= admitted

    def _open_session(
        self,
        who: str,
        context: flight.ServerCallContext,
        command: bytes,
        writer: flight.MetadataRecordBatchWriter,
    ) -> _Peer | None:
        """Check the hello (read under HELLO_LIMITS, with the caller's certificate name) and
        register the session as waiting for its uplink; a refused one is answered ``refuse``
        and gives None."""
        tls_name = _tls_name(context)
        session = HubSession(**self._session_options(), tls_name=tls_name)
        msg = None
        try:
            if tls_name is None and self.tls is not None and self.tls.mutual:
                # gRPC verified a certificate with no name: nothing to hold the hello's id to
                raise AuthenticationError("the client certificate names no one (no CN or SAN)")
            msg = _control(command, HELLO_LIMITS)
            session.receive(msg)
            hello = session.hello
            assert hello is not None
            with self._sessions:
                if self._closing:
                    return None
                if hello.session in self._pending:
                    raise SessionRefused(f"session id {hello.session!r} is already opening")
                peer = _Peer(hello, session, tls_name)
                self._pending[hello.session] = peer
                self._sessions.notify_all()
            return peer
        except SessionRefused as exc:
            sid = None if msg is None else msg.meta.get("session")
            if isinstance(sid, str):  # before the answer: the client hangs up its uplink after
                with self._sessions:
                    self._refused_ids.append(sid)
            with contextlib.suppress(*FLIGHT_ERRORS):  # it hung up already
                writer.begin(SCHEMA)
                writer.write_metadata(session.refusal(exc).to_bytes())
            self._refused(who, exc)
        except WireError as exc:
            self._refused(who, exc)
        return None

    def _wait(
        self, context: flight.ServerCallContext, ready: Callable[[], bool], timeout: float
    ) -> bool:
        """With ``_sessions`` held, wait up to ``timeout`` seconds for ``ready()``; give up
        early when the hub closes or the call is cancelled."""
        deadline = deadline_after(timeout)
        while not ready():
            left = remaining(deadline)
            if not left or self._closing or context.is_cancelled():
                return False
            self._sessions.wait(min(left, POLL_S))
        return True

    def _await_uplink(self, who: str, context: flight.ServerCallContext, peer: _Peer) -> bool:
        with self._sessions:
            if self._wait(context, lambda: peer.attached, HANDSHAKE_TIMEOUT):
                return True
            if self._pending.get(peer.hello.session) is peer:
                del self._pending[peer.hello.session]  # under the lock an uplink attaches with
            closing = self._closing
        if not closing:
            how = "hung up" if context.is_cancelled() else "opened no uplink in time"
            self._refused(who, TransportError(f"{peer.client_id!r} {how}"))
        return False

    def _serve_uplink(
        self,
        context: flight.ServerCallContext,
        session: str,
        reader: flight.MetadataRecordBatchReader,
    ) -> None:
        """Attach to the session's downlink, join its client, then deliver its messages."""
        who = _who(context)
        tls_name = _tls_name(context)
        peer = None

        def opening() -> bool:
            # under TLS, only the certificate that opened the downlink may open its uplink
            waiting = self._pending.get(session)
            return waiting is not None and waiting.tls_name == tls_name

        with self._handshake(who) as admitted, self._sessions:
            if admitted and self._wait(context, opening, HANDSHAKE_TIMEOUT):
                peer = self._pending.pop(session)
                peer.attached = True
                self._sessions.notify_all()
        if peer is None:
            with self._sessions:
                answered = session in self._refused_ids  # its hello's refusal was reported
            if admitted and not self._closing and not answered:
                self._refused(who, TransportError(f"uplink for no opening session {session!r}"))
            return
        if self._admit(peer):
            self._end(peer, self._read_loop(peer, context, reader))

    def _admit(self, peer: _Peer) -> bool:
        """Make ``peer`` the member for its client id (ending an older session), with its
        welcome first on its downlink; False if the hub is closing."""
        cid = peer.client_id
        try:
            peer.submit(_Job(control=peer.session.welcome().to_bytes()))
        except PeerGone:  # its downlink broke already
            return False
        with self._sessions:
            closing = self._closing
            if not closing:
                old = self._peers.get(cid)
                self._peers[cid] = peer
        if closing:
            peer.stop("the hub is closing")
            return False
        if old is not None:
            log.info("flight: client %r reconnected; ending its old session", cid)
            old.stop("replaced by a new session")
        self._joined(
            cid, peer.hello.decoders, session=peer, max_message_bytes=peer.hello.max_message_bytes
        )
        if peer.gone is not None:  # it ended while joining: its leave may have found no member
            self._end(peer, peer.gone)
            self._left(cid, peer.gone, session=peer)
        return True

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
            except FLIGHT_ERRORS as exc:
                job.error = PeerGone(f"downlink to client {peer.client_id!r} broke: {exc}")
                self._end(peer, f"downlink broke: {exc}")
            except Exception as exc:  # handed to the sender, which raises it
                job.error = exc
            finally:
                job.finished_at = time.perf_counter()
                job.done.set()

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
            except FLIGHT_ERRORS as exc:
                return f"stream broke: {exc}"
            if chunk.data is not None:
                try:
                    whole = _feed(stream, chunk.data)
                except WireError as exc:  # the framing is lost: nothing after it is safe
                    self._deliver(peer, stream)
                    self._rejected(peer.client_id, exc)
                    return f"sent bytes that are not a tensorwire message ({exc})"
                if whole is not None and (reason := self._act(peer, whole)):
                    return reason
                if reason := self._deliver(peer, stream):
                    return reason
            if chunk.app_metadata is not None:
                try:
                    msg = _control(chunk.app_metadata, self.limits)
                except WireError as exc:
                    self._rejected(peer.client_id, exc)
                    continue
                if msg.kind == "data":
                    self._rejected(peer.client_id, WireError("data in app_metadata, not a batch"))
                    continue
                if reason := self._act(peer, msg):
                    return reason

    def _deliver(self, peer: _Peer, stream: MessageStream) -> str | None:
        """Act on the messages ``stream`` has completed, reporting the bad ones; return why
        the session ended, if one of them ended it."""
        while True:
            try:
                msg = stream.next_event()
            except WireError as exc:  # one bad message, skipped; the stream goes on
                self._rejected(peer.client_id, exc)
                continue
            if not isinstance(msg, Message):  # NEED_DATA: no whole message buffered yet
                return None
            if reason := self._act(peer, msg):
                return reason

    def _act(self, peer: _Peer, msg: Message) -> str | None:
        event = peer.session.receive(msg)
        if isinstance(event, Data):
            self._delivered(peer.client_id, msg)
        elif isinstance(event, Closed):
            return event.reason
        else:
            log.debug("flight: %r: %s", peer.client_id, event)
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

    def _start_send(
        self, client_id: str, enc: EncodedMessage, deadline: float | None
    ) -> Callable[[], None]:
        """Queue a stream's message for the client's downlink thread and return at once (the
        call returned waits for its write): the stream's next message is encoded meanwhile."""
        peer, job = self._submit(client_id, enc)
        return lambda: self._finish(peer, job, deadline)

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
            peer.stop("the hub is closing")
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


class _Watchdog:
    """Calls ``fire`` when an armed deadline passes: one thread for all of a channel's sends,
    started on the first, instead of a timer thread per send (a thread costs milliseconds).

    The thread sleeps until the deadline it last saw; arming a later one does not wake it (it
    looks again when it wakes), so back-to-back sends cost two lock round trips each.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._deadline: float | None = None  # time.monotonic() seconds; None: disarmed
        self._fire: Callable[[], None] | None = None
        self._wake_at: float | None = None  # when the thread will look next; None: not soon
        self._fired = False
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, fire: Callable[[], None]) -> None:
        with self._cond:
            self._deadline, self._fire, self._fired = deadline, fire, False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._wake_at is None or deadline < self._wake_at:
                self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = self._fire = None

    def fired(self) -> bool:
        """Whether the deadline last armed passed (and ``fire`` was called)."""
        with self._cond:
            return self._fired

    def stop(self) -> None:
        with self._cond:
            thread, self._thread = self._thread, None
            self._deadline = self._fire = None
            self._cond.notify()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                if self._thread is not me:
                    return
                now = time.monotonic()
                fire = self._fire if self._deadline is not None and self._deadline <= now else None
                if fire is None:
                    self._wake_at = self._deadline
                    self._cond.wait(None if self._deadline is None else self._deadline - now)
                    continue
                self._deadline = self._fire = None
                self._fired = True
            fire()  # outside the lock: it cancels a gRPC call


@dataclass(eq=False)
class _Session:
    client: flight.FlightClient
    session: ClientSession
    down: flight.FlightStreamReader
    down_writer: flight.FlightStreamWriter
    up: flight.FlightStreamWriter
    up_call: flight.FlightStreamReader  # never read: it cancels the uplink
    stream: MessageStream
    inbox: Inbox = field(default_factory=Inbox)  # the hub's record batches, for recv
    answered: threading.Event = field(default_factory=threading.Event)  # welcome, refuse, end
    thread: threading.Thread | None = None


class FlightChannel(Channel):
    """A client's session with a :class:`FlightHub`; retries reaching it for ``timeout`` seconds.

    ``batch_bytes`` caps the message bytes per record batch (gRPC message) it sends. ``tls``
    makes it speak gRPC over TLS (``tls.ca`` verifies the hub; ``tls.cert``/``tls.key`` are
    its own certificate for mutual TLS); ``key`` is its enrolled secret (bytes, hex, or a
    file of hex), proven in every hello.
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
        tls: TLS | None = None,
        key: Any = None,
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self.client_id = client_id or default_client_id()
        query_options(url, ())
        host, port = host_port(url)
        self._credentials(tls, key)
        self._tls_options = {} if tls is None else _client_tls(tls)
        self._location = _location(host, port, tls)
        self._batch_bytes = batch_bytes
        self._send_lock = threading.RLock()  # the uplink's writer: sends, bye, close
        self._watchdog = _Watchdog(f"tensorwire-flight-deadline-{self.client_id}")
        self._session: _Session | None = None
        self.reconnect(timeout)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)open a session with the hub and say hello with the same client id."""
        self._drop()
        s = dial(self._open, what=self.url, timeout=timeout)
        welcome = s.session.welcome
        assert welcome is not None
        self.hub_decoders = welcome.decoders
        self.hub_max_bytes = welcome.max_message_bytes
        self._session = s

    def _open(self, deadline: float | None) -> _Session:
        """One attempt at a session: both calls, then the hub's answer by ``deadline`` (at
        most twice the hub's handshake window). ``OSError`` when it may be worth retrying."""
        session = self._client_session(f"the hub at {self.url}")
        client = flight.FlightClient(self._location, **self._tls_options)
        try:
            hello = flight.FlightDescriptor.for_command(session.hello().to_bytes())
            down_writer, down = client.do_exchange(hello)
            up, up_call = client.do_exchange(flight.FlightDescriptor.for_path(*UP, session.session))
        except flight.FlightUnavailableError as exc:
            client.close()
            raise _unreachable(self.url, exc) from None
        except FLIGHT_ERRORS as exc:
            client.close()
            raise TransportError(f"cannot open a session with {self.url}: {exc}") from None
        with contextlib.suppress(*FLIGHT_ERRORS):  # no hub there: the reader says so
            down_writer.done_writing()  # before the reader starts: it may then finish the call
            up.begin(SCHEMA)
        s = _Session(
            client,
            session,
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
        wait = remaining(deadline)
        s.answered.wait(2 * HANDSHAKE_TIMEOUT if wait is None else min(wait, 2 * HANDSHAKE_TIMEOUT))
        failure = s.inbox.failed  # before the close below fails it too
        if s.session.welcome is not None and failure is None:
            return s
        self._close_session(s)
        raise failure or TransportTimeout(f"no answer from the hub at {self.url} in time")

    def _read_loop(self, s: _Session) -> None:
        """Queue the hub's batches for :meth:`recv`; act on control messages as they come."""
        where = f"the hub at {self.url}"
        try:
            while True:
                chunk = s.down.read_chunk()
                if chunk.data is not None:
                    s.inbox.put(chunk.data)
                if chunk.app_metadata is None:
                    continue
                try:
                    msg = _control(chunk.app_metadata, self.limits)
                except WireError as exc:
                    log.warning("flight: ignoring a bad control message from %s: %s", where, exc)
                    continue
                try:
                    event = s.session.receive(msg)
                except TransportError as exc:  # refused, or not a tensorwire hub
                    s.inbox.fail(exc)
                    return
                if isinstance(event, Closed):
                    s.inbox.fail(s.session.closed_error())
                    return
                if isinstance(event, Data):
                    log.warning("flight: ignoring data in app_metadata from %s", where)
                if s.session.welcome is not None:
                    s.answered.set()
        except StopIteration:
            s.inbox.fail(PeerGone(f"{where} ended the session"))
        except flight.FlightUnavailableError as exc:
            s.inbox.fail(_unreachable(self.url, exc))
        except FLIGHT_ERRORS as exc:
            s.inbox.fail(PeerGone(f"the session with {where} broke: {exc}"))
        finally:
            s.up_call.cancel()  # so the hub's end of the uplink ends too
            s.answered.set()

    def _live(self) -> _Session:
        if self._session is None:
            raise PeerGone("channel is closed; call reconnect()")
        return self._session

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        s = self._live()
        with self._send_lock:
            if deadline is not None:  # a blocked gRPC write ends only when its call is cancelled
                self._watchdog.arm(deadline, s.up_call.cancel)
            try:
                for piece in _pieces(enc, self._batch_bytes):
                    s.up.write_batch(_batch(piece))
            except FLIGHT_ERRORS as exc:
                self._drop()  # half a message leaves the uplink unusable
                if self._watchdog.fired():
                    raise TransportTimeout(f"send of {enc.nbytes} bytes timed out") from None
                raise PeerGone(f"session with {self.url} broke: {exc}") from None
            finally:
                self._watchdog.disarm()

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        s = self._live()
        while True:
            if not s.stream.in_message:
                s.stream.set_out(out)
            msg = s.stream.next_event()  # a bad message raises its WireError; the stream goes on
            if isinstance(msg, Message):  # else NEED_DATA: no whole message buffered yet
                if msg.kind == "data":
                    return msg
                if isinstance(s.session.receive(msg), Closed):
                    self._drop()
                    raise s.session.closed_error()
                continue
            try:
                batch = s.inbox.get(deadline)
            except PeerGone:
                self._drop()
                raise
            try:
                whole = _feed(s.stream, batch)
            except WireError:
                self._drop()  # framing is lost with the bytes of a bad batch
                raise
            if whole is not None:  # as next_event would give it, without the queue
                if whole.kind == "data":
                    return whole
                if isinstance(s.session.receive(whole), Closed):
                    self._drop()
                    raise s.session.closed_error()

    def _drop(self) -> None:
        """End the session at once, without a goodbye."""
        s, self._session = self._session, None
        if s is not None:
            s.inbox.fail(PeerGone("channel is closed; call reconnect()"))
            self._close_session(s)

    def _close_session(self, s: _Session) -> None:
        s.down.cancel()  # cancels end blocked reads and writes at once
        s.up_call.cancel()
        if s.thread is not None:
            s.thread.join(timeout=5)
        with self._send_lock:
            for closable in (s.down_writer, s.up, s.client):
                with contextlib.suppress(*FLIGHT_ERRORS):
                    closable.close()

    def close(self) -> None:
        """Say goodbye to the hub and end the session."""
        s = self._session
        if s is not None:
            with self._send_lock, contextlib.suppress(*FLIGHT_ERRORS):
                s.up.write_metadata(bye().to_bytes())
                s.up.done_writing()
            if s.thread is not None:
                s.thread.join(BYE_TIMEOUT)  # the hub ends the downlink on our bye
            self._drop()
        self._watchdog.stop()
