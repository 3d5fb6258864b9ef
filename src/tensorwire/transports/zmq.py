"""``zmq+tcp://host:port``: a ZeroMQ ROUTER on the hub, a DEALER per client (identity = client id).

Handshake as in ``tcp://``: the client's ``hello`` (its id and decoders), the hub's ``welcome``;
``bye`` to close. A tensorwire message travels as a run of ZeroMQ messages of at most
``PIECE_BYTES`` of payload each, its bytes (head, tensor data, digests) in order after a
one-byte marker: ``S`` starts a tensorwire message, ``C`` continues it. Buffers from 64 KiB up
are frames of their own, sent zero-copy; runs of smaller ones are joined into one frame (pyzmq
would copy them anyway), the marker into the first, so a small message is one frame.

Not one multipart per message: libzmq passes a multipart on only once its last part is queued,
so the sender's hashing, the wire and the receiver's copy would run one after the other; in
pieces they overlap (64 MiB: ~60 ms in pieces, ~130 ms as one multipart, ~100 ms for pyzmq's
own send/recv of the bare array, in one prototype run). The receiver copies each piece into
the tensor it belongs to, never joining frames (the one copy pyzmq's users make too), and
libzmq's 1 MiB receive buffers are reused where a whole-message buffer would be page-faulted
in anew each time. The marker lets a receiver drop a bad message and resume at the next ``S``:
garbage spoils one message, never the connection.

Broadcast is a ROUTER send of the same zero-copy frames to each client, not PUB: libzmq writes
every connection from its I/O thread either way (measured alike for 8 clients x 16 MiB), and a
ROUTER keeps each client's messages in one ordered stream, needs no subscription handshake
(a client is routable as soon as its hello arrived), and never drops a message at a high-water
mark (``SNDHWM`` 0; a send waits until libzmq has released the buffers instead).

ZeroMQ sockets are not thread-safe. The hub's ROUTER is guarded by a lock: a send runs in the
calling thread (no hand-off to another thread), and a reader thread takes the lock only to
read, waiting outside it on the socket's ``ZMQ_FD``. The hub learns of lost connections from a
socket monitor (``DISCONNECTED`` names the file descriptor; ``ZMQ_SRCFD`` of the hello ties it
to a client). libzmq queues a connection's last messages on the ROUTER before it reports the
connection closed, so a client leaves only once a read that began after its ``DISCONNECTED``
found the ROUTER empty: what it sent just before closing is delivered first.

A channel's DEALER is used by whichever thread calls ``send``/``recv``, one at a time: a thread
that needs it while a ``recv`` waits in ``poll`` wakes that ``recv`` through a socketpair, so a
channel used from one thread pays no hand-off either.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from tensorwire.codecs import get_codec
from tensorwire.errors import (
    BadMagic,
    PeerGone,
    TransportError,
    TransportTimeout,
    TruncatedMessage,
    WireError,
)
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
from tensorwire.wire import NEED_DATA, EncodedMessage, Limits, Message, MessageStream

log = logging.getLogger("tensorwire.transports.zmq")

PIECE_BYTES = 1 << 20  # payload of one ZeroMQ message: hashed and copied while still in cache
MAX_FRAME_BYTES = 16 << 20  # a peer sending a bigger frame is disconnected by libzmq
START, MORE = b"S", b"C"  # first frame of every ZeroMQ message: starts / continues a message
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before closing anyway
HEARTBEAT_IVL_MS = 5_000  # ZMTP pings find connections whose peer vanished without a FIN
HEARTBEAT_TIMEOUT_MS = 30_000
READ_BATCH = 64  # ZeroMQ messages the hub reads per hold of the ROUTER lock


def _endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _configure(sock: zmq.Socket, host: str) -> None:
    sock.linger = 0
    sock.sndhwm = 0  # never drop or refuse for a full queue: senders wait on trackers instead
    sock.maxmsgsize = MAX_FRAME_BYTES
    sock.heartbeat_ivl = HEARTBEAT_IVL_MS
    sock.heartbeat_timeout = HEARTBEAT_TIMEOUT_MS
    sock.ipv6 = ":" in host


def _waker() -> tuple[socket.socket, socket.socket]:
    """A socketpair whose read end a ``zmq.Poller`` watches, so other threads can wake it."""
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    return r, w


def _wake(w: socket.socket) -> None:
    with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or already closed
        w.send(b"\0")


def _drain(r: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while r.recv(4096):
            pass


def _poll_ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000) + 1


def _batches(enc: EncodedMessage) -> Iterator[list[bytes | memoryview]]:
    """The message's bytes as lists of buffers of about ``PIECE_BYTES``, digests computed on the
    way (``segments``), buffers bigger than a piece sliced without copying."""
    for batch in enc.segments(PIECE_BYTES):
        if all(len(b) <= PIECE_BYTES for b in batch):
            yield batch
            continue
        for buf in batch:  # a big head, or a tensor whose digest an earlier send computed
            view = memoryview(buf)
            for start in range(0, len(view), PIECE_BYTES):
                yield [view[start : start + PIECE_BYTES]]


# Plain ints: pyzmq's enum arithmetic costs microseconds per frame.
_SEND_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_SEND_LAST = int(zmq.NOBLOCK)
_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)


def _frames(marker: bytes, batch: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """``batch`` as frames: each buffer from pyzmq's copy threshold up zero-copy on its own,
    each run of smaller ones joined into one (pyzmq would copy them anyway), the marker first."""
    threshold = zmq.COPY_THRESHOLD
    frames: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = [marker]
    for buf in batch:
        if len(buf) < threshold:
            run.append(buf)
            continue
        if run:
            frames.append(b"".join(run))
            run = []
        frames.append(buf)
    if run:
        frames.append(b"".join(run))
    return frames


def _transmit(
    sock: zmq.Socket, enc: EncodedMessage, envelope: tuple[bytes, ...] = ()
) -> list[zmq.MessageTracker]:
    """Queue ``enc`` on ``sock`` as ZeroMQ messages ``[*envelope, *_frames(...)]`` without
    blocking.

    Returns the trackers of the frames libzmq shares with us (zero-copy, above pyzmq's copy
    threshold): the caller waits on them before the arrays may change.
    """
    trackers = []
    marker = START
    for batch in _batches(enc):
        parts = [*envelope, *_frames(marker, batch)]
        last = len(parts) - 1
        for i, part in enumerate(parts):
            tracker = sock.send(
                part, _SEND_MORE if i < last else _SEND_LAST, copy=False, track=True
            )
            if not tracker.done:
                trackers.append(tracker)
        marker = MORE
    return trackers


def _wait_released(trackers: list[zmq.MessageTracker], deadline: float | None, to: str) -> None:
    """Block until libzmq has written (or dropped) every zero-copy part, or the deadline."""
    for tracker in trackers:
        left = remaining(deadline)
        try:
            tracker.wait(-1 if left is None else left)
        except zmq.NotDone:
            raise TransportTimeout(
                f"message to {to} not sent within the timeout; ZeroMQ still reads its arrays, "
                "so leave them unchanged or close the endpoint"
            ) from None


class _Reassembler:
    """Tensorwire messages back from the ZeroMQ messages one peer sent (see the module doc)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._stream = self._new_stream()

    def _new_stream(self) -> MessageStream:
        return MessageStream(limits=self.limits, codec_lookup=get_codec)

    @property
    def in_message(self) -> bool:
        """True while a message is partly received."""
        return self._stream.in_message

    def feed(
        self, frames: list[zmq.Frame], out: Mapping[Any, Any] | None = None
    ) -> list[Message | WireError]:
        """Take one ZeroMQ message; return the messages it completes and the errors it raised.

        ``out`` (arrays by name path) is used when this ZeroMQ message starts a new one.
        """
        events: list[Message | WireError] = []
        head = frames[0].buffer
        marker = bytes(head[:1])
        if marker == START:
            if self._stream.in_message:
                events.append(
                    TruncatedMessage("a message was cut short: the sender started the next one")
                )
                self._stream = self._new_stream()
            self._stream.set_out(out)
        elif marker == MORE:
            if not self._stream.in_message:
                return events  # the rest of a message whose framing was already lost
        else:
            return [
                BadMagic(
                    f"a ZeroMQ message starting {bytes(head[:8])!r} is not part of a tensorwire "
                    "message (no segment marker)"
                )
            ]
        step = self._stream.max_read
        try:
            for view in (head[1:], *(f.buffer for f in frames[1:])):
                for start in range(0, len(view), step):
                    self._stream.receive_data(view[start : start + step])
        except WireError as exc:  # framing lost: drop this message, resume at the next START
            self._stream = self._new_stream()
            events.append(exc)
            return events
        while True:
            try:
                event = self._stream.next_event()
            except WireError as exc:  # a bad message the stream skipped to its end
                events.append(exc)
                continue
            if event is NEED_DATA:
                return events
            events.append(event)


def _peer_name(ident: bytes) -> str:
    try:
        return ident.decode("utf-8") if ident[:1] != b"\0" else f"0x{ident.hex()}"
    except UnicodeDecodeError:
        return f"0x{ident.hex()}"


class ZmqHub(Hub):
    """Hub on ``zmq+tcp://host:port`` (port 0 picks a free one; see :attr:`url`).

    ``on_join`` / ``on_leave`` run on the hub's reader thread: while they run no message is
    read, so keep them short (sending from them is fine).
    """

    protocol = "zmq"

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(**options)
        host, port = host_port(url, default_port=0)
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        _configure(self._router, host)
        self._router.router_mandatory = 1  # a send to a gone client raises, never vanishes
        self._router.router_handover = 1  # a client reconnecting with its id takes it over
        self._monitor = self._router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            self._router.bind(_endpoint(host, port or "*"))
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            raise TransportError(f"cannot listen on {url}: {exc}") from None
        self.url = "zmq+" + self._router.last_endpoint.decode()
        self._lock = threading.Lock()  # whoever holds it may use the ROUTER
        self._stopping = False
        self._readers: dict[bytes, _Reassembler] = {}
        self._fd_of: dict[bytes, int] = {}  # client identity -> fd of its connection
        self._on_fd: dict[int, bytes] = {}
        self._closing: list[tuple[bytes, int]] = []  # (identity, fd) seen closed, not yet left
        self._wake_r, self._wake_w = _waker()
        self._io = threading.Thread(target=self._run, name="tensorwire-zmq-hub", daemon=True)
        self._io.start()

    # -- the reader thread -------------------------------------------------------------

    def _run(self) -> None:
        # ZMQ_FD is edge-triggered: wait on it only after a read that ended in EAGAIN; a
        # sender that may have consumed its edge wakes us instead (_check_readable).
        selector = selectors.DefaultSelector()
        for fd in (self._router.fd, self._monitor.fd, self._wake_r.fileno()):
            selector.register(fd, selectors.EVENT_READ)
        with selector:
            while not self._stopping:
                self._read_monitor()
                closed_before_read = len(self._closing)
                batch, more = self._read_batch()
                for frames in batch:
                    ident = frames[0].bytes
                    try:
                        self._on_message(ident, frames[1:])
                    except Exception:  # e.g. an on_join callback that raised: serve the others
                        log.exception("zmq: handling a message from %r failed", _peer_name(ident))
                del batch  # hand libzmq its buffers back before waiting
                if more:
                    continue
                # The ROUTER was empty: it held the last messages of connections closed earlier.
                self._forget_closed(closed_before_read)
                if not self._stopping and not self._closing:
                    selector.select()
                    _drain(self._wake_r)

    def _read_batch(self) -> tuple[list[list[zmq.Frame]], bool]:
        """Up to READ_BATCH messages, and whether more may be waiting (no EAGAIN seen)."""
        batch: list[list[zmq.Frame]] = []
        with self._lock:
            if self._stopping:
                return batch, False
            for _ in range(READ_BATCH):
                try:
                    batch.append(self._router.recv_multipart(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    return batch, False
        return batch, True

    def _check_readable(self) -> None:
        """After using the ROUTER (lock held): wake the reader if that consumed its FD edge."""
        if self._router.get(_EVENTS) & _POLLIN:
            _wake(self._wake_w)

    def _read_monitor(self) -> None:
        """Note connections that closed; called before every hello (see _welcome).

        Their clients stay members until :meth:`_forget_closed`: messages they sent before
        closing may still be queued on the ROUTER.
        """
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = int(event["value"])
            ident = self._on_fd.pop(fd, None)  # now, as a new connection may reuse the fd
            if ident is not None and self._fd_of.get(ident) == fd:
                self._closing.append((ident, fd))

    def _forget_closed(self, n: int) -> None:
        """The first ``n`` closed connections' clients leave, unless they said goodbye or
        reconnected meanwhile; call only once the ROUTER was read empty after noting them."""
        closed, self._closing = self._closing[:n], self._closing[n:]
        for ident, fd in closed:
            if self._fd_of.get(ident) == fd:
                del self._fd_of[ident]
                self._readers.pop(ident, None)
                self._left(_peer_name(ident), "connection lost")

    def _on_message(self, ident: bytes, frames: list[zmq.Frame]) -> None:
        cid = _peer_name(ident)
        reader = self._readers.get(ident)
        if reader is None:
            reader = self._readers[ident] = _Reassembler(self.limits)
        for event in reader.feed(frames):
            if isinstance(event, WireError):
                self._rejected(cid, event)
            elif event.kind == "hello":
                self._welcome(ident, cid, event, frames[-1].get(zmq.SRCFD))
            elif event.kind == "data":
                if cid in self._members:
                    self._delivered(cid, event)
                else:
                    log.warning("zmq: %r sent data without a hello; told it to reconnect", cid)
                    self._send_control(ident, "bye")
            elif event.kind == "bye":
                self._readers.pop(ident, None)
                self._on_fd.pop(self._fd_of.pop(ident, -1), None)
                self._left(cid, "said goodbye")
            else:
                log.debug("zmq: ignoring %r message from %r", event.kind, cid)
        if ident not in self._fd_of and not reader.in_message:
            self._readers.pop(ident, None)  # strangers keep no state between their messages

    def _welcome(self, ident: bytes, cid: str, hello: Message, fd: int) -> None:
        try:
            claimed, decoders = parse_hello(hello)
            if claimed != cid:
                raise TransportError(f"hello names {claimed!r} but the ZeroMQ identity is {cid!r}")
        except TransportError as exc:
            log.warning("zmq: refused %r: %s", cid, exc)
            self._send_control(ident, "bye")
            return
        # Closed connections first: the fd of this hello may have been another client's.
        self._read_monitor()
        self._on_fd.pop(self._fd_of.get(ident, -1), None)
        self._fd_of[ident], self._on_fd[fd] = fd, ident
        self._send_control(
            ident, "welcome", {"decoders": self.decoders, "version": PROTOCOL_VERSION}
        )
        self._joined(cid, decoders)

    def _send_control(self, ident: bytes, kind: str, meta: dict[str, Any] | None = None) -> None:
        try:
            self._queue(ident, control_message(kind, meta or {}))
        except TransportError as exc:
            log.info("zmq: could not send %s to %r: %s", kind, _peer_name(ident), exc)

    # -- sending, from any thread ------------------------------------------------------

    def _queue(self, ident: bytes, enc: EncodedMessage) -> list[zmq.MessageTracker]:
        """Hand ``enc`` to libzmq for one client (never blocks for long); return its trackers."""
        with self._lock:
            if self._stopping:
                raise PeerGone("the hub is closed")
            try:
                return _transmit(self._router, enc, (ident,))
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    raise PeerGone(f"client {_peer_name(ident)!r} is not connected") from None
                raise TransportError(f"zmq: sending to {_peer_name(ident)!r}: {exc}") from None
            finally:
                self._check_readable()

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        _wait_released(self._queue(client_id.encode(), enc), deadline, repr(client_id))

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Queue the message for every client at once; libzmq's I/O thread writes them all."""
        t = time.perf_counter()
        results: dict[str, float | Exception] = {}
        queued = []
        for c in clients:
            try:
                queued.append((c, self._queue(c.encode(), enc)))
            except TransportError as exc:
                results[c] = exc
        for c, trackers in queued:
            try:
                _wait_released(trackers, deadline, repr(c))
                results[c] = time.perf_counter() - t
            except TransportError as exc:
                results[c] = exc
        return results

    def _close_transport(self) -> None:
        with self._lock:
            self._stopping = True
        _wake(self._wake_w)
        self._io.join(timeout=10)
        if self._io.is_alive():
            log.error("zmq: the hub's reader thread did not stop; leaving its sockets open")
            return
        bye = control_message("bye", {})
        with self._lock:
            for ident in list(self._fd_of):
                with contextlib.suppress(zmq.ZMQError):
                    _transmit(self._router, bye, (ident,))
        self._router.disable_monitor()
        self._monitor.close(linger=0)
        self._router.close(linger=int(BYE_TIMEOUT * 1000))
        self._ctx.term()  # returns once the byes are out, or after BYE_TIMEOUT
        self._wake_r.close()
        self._wake_w.close()


class ZmqChannel(Channel):
    """A client's DEALER connected to a :class:`ZmqHub`; waits up to ``timeout`` seconds for it."""

    protocol = "zmq"

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
        self._identity = self.client_id.encode()
        if not 0 < len(self._identity) <= 255 or self._identity[:1] == b"\0":
            raise ValueError(
                f"client id {self.client_id!r} cannot be a ZeroMQ identity: it needs 1 to 255 "
                "bytes of UTF-8, not starting with NUL"
            )
        self._host, self._port = host_port(url)
        self._cv = threading.Condition()
        self._busy = False  # a thread is using the sockets
        self._waiting = 0  # threads that want them
        self._pending: deque[Message | WireError] = deque()
        self._closed = True
        self.reconnect(timeout)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)connect to the hub and say hello with the same client id."""
        if not self._closed:
            self._drop()
        deadline = deadline_after(timeout)
        with self._owning():
            self._ctx = zmq.Context()
            self._dealer = self._ctx.socket(zmq.DEALER)
            _configure(self._dealer, self._host)
            self._dealer.identity = self._identity
            self._dealer.immediate = 1  # nothing queued for a connection that is not up
            self._monitor = self._dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._wake_r, self._wake_w = _waker()
            self._poller = zmq.Poller()
            for sock in (self._dealer, self._monitor, self._wake_r):
                self._poller.register(sock, zmq.POLLIN)
            self._reader = _Reassembler(self.limits)
            self._pending.clear()
            self._closed = self._lost = False
            try:
                self._dealer.connect(_endpoint(self._host, self._port))
            except zmq.ZMQError as exc:
                self._teardown(0.0)
                raise TransportError(f"cannot connect to {self.url}: {exc}") from None
        try:
            hello = {"client_id": self.client_id, "decoders": self.decoders}
            self._send_encoded(
                control_message("hello", {**hello, "version": PROTOCOL_VERSION}), deadline
            )
            welcome = self._next_message(deadline, None)
        except TransportTimeout:
            self._drop()
            raise TransportTimeout(
                f"no ZeroMQ hub answered at {self.url} within {timeout} s"
            ) from None
        except (WireError, TransportError):
            self._drop()
            raise
        if welcome.kind != "welcome":
            self._drop()
            raise TransportError(f"hub at {self.url} answered {welcome.kind!r} instead of welcome")
        self.hub_decoders = frozenset(welcome.meta.get("decoders", []))

    # -- one thread at a time on the sockets -------------------------------------------

    @contextlib.contextmanager
    def _owning(self) -> Iterator[None]:
        """Hold the sockets; a ``recv`` waiting in ``poll`` is woken to hand them over."""
        with self._cv:
            if self._busy:
                self._waiting += 1
                _wake(self._wake_w)
                while self._busy:
                    self._cv.wait()
                self._waiting -= 1
            self._busy = True
        try:
            yield
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def _step_aside(self) -> None:
        """Called by the owner when woken: let the threads that asked go first."""
        _drain(self._wake_r)
        with self._cv:
            self._busy = False
            self._cv.notify_all()
            while self._busy or self._waiting:
                self._cv.wait()
            self._busy = True

    def _check_usable(self) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        if self._lost:
            raise PeerGone(f"lost the connection to the hub at {self.url}; call reconnect()")

    def _read_monitor(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._lost = True

    # -- sending -----------------------------------------------------------------------

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        with self._owning():
            self._check_usable()
            self._wait_connected(deadline)
            try:
                trackers = _transmit(self._dealer, enc)
            except zmq.Again:  # with IMMEDIATE only a lost connection refuses a part
                self._lost = True
                raise PeerGone(
                    f"lost the connection to the hub at {self.url} while sending"
                ) from None
        _wait_released(trackers, deadline, "the hub")

    def _wait_connected(self, deadline: float | None) -> None:
        if self._dealer.get(_EVENTS) & _POLLOUT:
            return
        poller = zmq.Poller()
        poller.register(self._dealer, zmq.POLLOUT)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(_poll_ms(remaining(deadline))))
            if self._dealer in ready:
                return
            self._read_monitor()
            self._check_usable()
            if remaining(deadline) == 0.0:
                raise TransportTimeout(f"not connected to the hub at {self.url} within the timeout")

    # -- receiving ---------------------------------------------------------------------

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        while True:
            msg = self._next_message(deadline, out)
            if msg.kind == "data":
                return msg
            if msg.kind == "bye":
                self._drop()
                raise PeerGone(f"hub at {self.url} closed the session")

    def _next_message(self, deadline: float | None, out: Any) -> Message:
        """The next message of any kind; its WireError if it was malformed."""
        while not self._pending:
            frames = self._next_frames(deadline)
            self._pending.extend(self._reader.feed(frames, out))
            del frames  # hand libzmq its buffers back before waiting again
        event = self._pending.popleft()
        if isinstance(event, WireError):
            raise event
        return event

    def _next_frames(self, deadline: float | None) -> list[zmq.Frame]:
        with self._owning():
            while True:
                self._check_usable()
                try:
                    return self._dealer.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    pass
                left = remaining(deadline)
                if left == 0.0:
                    raise TransportTimeout(f"no message from the hub at {self.url} in time")
                ready = dict(self._poller.poll(_poll_ms(left)))
                if self._monitor in ready:
                    self._read_monitor()  # lost: what arrived before is still read first
                if self._wake_r.fileno() in ready:
                    self._step_aside()

    # -- closing -----------------------------------------------------------------------

    def _teardown(self, linger_s: float) -> None:
        self._closed = True
        self._dealer.disable_monitor()
        self._monitor.close(linger=0)
        self._dealer.close(linger=int(linger_s * 1000))
        self._ctx.term()  # returns once a goodbye is out, or after the linger
        self._wake_r.close()
        self._wake_w.close()

    def _drop(self) -> None:
        """Close the connection without a goodbye."""
        with self._owning():
            if not self._closed:
                self._teardown(0.0)

    def close(self) -> None:
        """Say goodbye to the hub and close the connection."""
        with self._owning():
            if self._closed:
                return
            linger = 0.0
            if not self._lost:
                with contextlib.suppress(zmq.ZMQError):
                    _transmit(self._dealer, control_message("bye", {}))
                    linger = BYE_TIMEOUT
            self._teardown(linger)
