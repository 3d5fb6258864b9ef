"""``zmq+tcp://host:port``: a ZeroMQ ROUTER on the hub, a DEALER per client session.

``docs/transports/zmq.md`` specifies what goes over the wire; in short:

Session. The client's first tensorwire message is its ``hello``, the hub answers ``welcome``
(or ``refuse``), ``bye`` ends the session (:mod:`~tensorwire.transports.session`). The
DEALER's ZeroMQ routing id is the hello's ``session``: 32 random hex digits, new for every
connection. The hub addresses a client only by the routing id its hello came on, refuses a
hello whose ``session`` is not that routing id, and leaves ``ROUTER_HANDOVER`` off, so a peer
that connects with a routing id already in use is never routed to: nobody can take over a
client's messages without guessing its session id, and not even then while it is connected.

Framing. A tensorwire message travels as a run of ZeroMQ messages ("pieces") of at most
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
garbage, or a send cut short by its deadline, spoils one message, never the connection.

Flow control. Every socket queues at most ``QUEUE_PIECES`` pieces per peer each way (high-water
marks), so a peer that stops reading costs at most that much memory. A send queues the pieces
it can without blocking; when a client's queue is full it retries until its deadline, then
raises :class:`TransportTimeout` (a ``slow`` client), never reporting a message it could not
queue as sent. Broadcast is a ROUTER send of the same zero-copy frames to each client, round
robin so a full queue holds up only its own client; not PUB: libzmq writes every connection
from its I/O thread either way (measured alike for 8 clients x 16 MiB), and a ROUTER keeps
each client's messages in one ordered stream and needs no subscription handshake.

Threads. ZeroMQ sockets are not thread-safe. The hub's ROUTER is guarded by a lock: a send
runs in the calling thread (no hand-off to another thread). Reading is a turn: a thread in
``hub.recv`` reads the ROUTER itself and returns the first message it completes, so a message
is not handed from a reader thread to the caller; while nobody is in ``recv`` (and for
``CALLER_LINGER_S`` after, so that back-to-back calls find the ROUTER free) the hub's reader
thread reads, so joins, leaves and ``gather`` are served. Whoever reads takes the lock only to
read, and waits outside it in one ``poll`` on the ROUTER's ``ZMQ_FD``, the monitor's and a
wake-up socketpair. ``ZMQ_FD`` is edge-triggered: it is waited on only after ``ZMQ_EVENTS``
found the socket empty (no ``zmq.Again`` raised per message), and a send that may have taken
its edge while a reader waits wakes it. The hub learns of lost connections from a socket
monitor (``DISCONNECTED`` names the file descriptor; ``ZMQ_SRCFD`` of the hello ties it to a
session). libzmq queues a connection's last messages on the ROUTER before it reports the
connection closed, so a client leaves only once a read that began after its ``DISCONNECTED``
found the ROUTER empty: what it sent just before closing is delivered first. A channel's
DEALER is used by whichever thread calls ``send``/``recv``, one at a time: a thread that needs
it while a ``recv`` waits in ``poll`` wakes that ``recv`` through a socketpair, so a channel
used from one thread pays no hand-off either.

Small messages. A message under pyzmq's copy threshold (64 KiB) is one frame, joined once and
copied into libzmq's message: a zero-copy frame would cost a tracker and a trip through
pyzmq's garbage-collector thread when libzmq releases it. Round trips then make about the
system calls pyzmq's own ``send``/``recv`` make (libzmq's ``getpid`` and ``poll`` on its
mailbox), plus the one ``poll`` above; ``docs/transports/zmq.md`` section 11 gives figures.

Security. With ``tls=`` (or ``curve=``) the connection is encrypted with ZeroMQ's CURVE: the
hub's key pair comes from ``curve=`` (default ``hub.curve`` beside ``tls.cert``), a client
knows the hub's public key (default ``hub.curve.pub`` beside ``tls.ca``) and uses a fresh key
pair of its own per connection. ZeroMQ has no X.509, so identity is the hello's proof of the
device's enrolled secret (``auth=`` keys on the hub, ``key=`` on the client); a hub told to
check client certificates (``ca=``) without keys is refused at ``serve``, since it could not.
The socket monitors report failed handshakes: mismatched encryption is an
:class:`AuthenticationError` on the client, at once, and a ``refused`` event on the hub. A
message that does not open after the handshake (altered on the way) makes libzmq stop reading
the connection without closing it: the channel treats it as lost; the hub cannot tell which
connection it was, and its heartbeats close it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from tensorwire.codecs import get_codec
from tensorwire.errors import (
    AuthenticationError,
    BadMagic,
    PeerGone,
    SessionRefused,
    TransportError,
    TransportTimeout,
    TruncatedMessage,
    WireError,
)
from tensorwire.transports.base import (
    Channel,
    Hub,
    _log_limited,
    deadline_after,
    default_client_id,
    dial,
    remaining,
)
from tensorwire.transports.security import TLS, KeyAuthenticator
from tensorwire.transports.session import (
    HELLO_LIMITS,
    Closed,
    Data,
    Hello,
    HubSession,
    State,
    Welcomed,
    bye,
)
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import NEED_DATA, EncodedMessage, Limits, Message, MessageStream

log = logging.getLogger("tensorwire.transports.zmq")

PIECE_BYTES = 1 << 20  # payload of one ZeroMQ message: hashed and copied while still in cache
MAX_FRAME_BYTES = 2 * PIECE_BYTES  # a peer sending a bigger frame is disconnected by libzmq
QUEUE_PIECES = 32  # ZeroMQ messages each socket queues per peer and direction (high-water mark)
START, MORE = b"S", b"C"  # first frame of every ZeroMQ message: starts / continues a message
MIN_SESSION_CHARS = 16  # a routing id (= session id) shorter than this is guessable: refused
MAX_STRANGERS = 64  # peers without a session whose unfinished message the hub keeps at once
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before closing anyway
CONNECT_ATTEMPT_S = 1.0  # seconds a channel waits for the TCP connection before dial retries
FULL_WAIT_S = (0.0002, 0.002)  # first and longest wait between tries of a full queue, seconds
HEARTBEAT_IVL_MS = 5_000  # ZMTP pings find connections whose peer vanished without a FIN
HEARTBEAT_TIMEOUT_MS = 30_000
READ_BATCH = 64  # ZeroMQ messages the hub reads per hold of the ROUTER lock
CALLER_LINGER_S = 0.02  # the hub's reader thread leaves the ROUTER to recv callers this long
WAKE_BYTES = 4096  # wake-up bytes a woken reader takes in one read
HANDSHAKE_RESETS = 3  # handshakes a hub closed in one dial: its encryption does not match
URL_OPTIONS = ("curve",)  # beside the security options serve/connect take out of every URL
CURVE_KEY_CHARS = 40  # a CURVE key (32 bytes) in Z85
KEY_FILE_BYTES = 1024  # read of a key file: two keys and their line ends fit many times
# What a socket monitor reports: a connection closed, or its ZMTP handshake failed.
_MONITOR_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_MECHANISM_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)  # CURVE on one side only
_CRYPTOGRAPHIC = int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)  # a box that does not open
_PROTOCOL_ERRORS = {
    int(getattr(zmq, n)): n.removeprefix("PROTOCOL_ERROR_")
    for n in dir(zmq)
    if n.startswith("PROTOCOL_ERROR_")
}


def _protocol_error(code: int) -> str:
    """libzmq's name of a protocol error a monitor reported."""
    return f"ZMTP protocol error {_PROTOCOL_ERRORS.get(code, hex(code))}"


_CURVE_HINT = (
    "connect with curve=FILE (the hub's public key: hub.curve.pub from tensorwire certs) or "
    "tls=TLS(ca=...) with hub.curve.pub beside the CA"
)


# -- CURVE keys ------------------------------------------------------------------------------


def _key_lines(path: Path, what: str) -> list[str]:
    """The non-empty lines of a key file. Errors name the file, never its contents."""
    try:
        with path.open("rb") as f:
            data = f.read(KEY_FILE_BYTES)
    except OSError as exc:
        raise TransportError(f"cannot read {what} from {path}: {exc.strerror}") from None
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise TransportError(f"{path} is not a CURVE key file (Z85 keys, one per line)") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _z85_key(text: str, where: str) -> bytes:
    """``text`` as a Z85 CURVE key; ``TransportError`` naming ``where`` if it is not one."""
    key = text.encode()
    try:
        valid = len(key) == CURVE_KEY_CHARS and len(z85.decode(key)) == 32
    except (KeyError, ValueError):  # a character outside Z85's alphabet, a wrong length
        valid = False
    if not valid:
        raise TransportError(f"{where} is not a CURVE key ({CURVE_KEY_CHARS} Z85 characters)")
    return key


def _one_curve_option(
    url: str, curve: str | os.PathLike[str] | None
) -> str | os.PathLike[str] | None:
    """The CURVE key file ``curve=`` names, as an argument or as the URL's ``?curve=`` (both
    only if they agree); ``TransportError`` for any other URL option."""
    option = query_options(url, URL_OPTIONS).get("curve")
    if option == "":
        raise TransportError(f"{url!r}: curve= names no file")
    if option is not None and curve is not None and Path(option) != Path(curve):
        raise TransportError(f"{url!r}: curve= in the URL and as an argument differ")
    return curve if curve is not None else option


def _check_curve_available() -> None:
    if not zmq.has("curve"):
        raise TransportError(
            "this libzmq was built without CURVE, so zmq+tcp:// cannot encrypt: install a "
            "pyzmq wheel (it bundles libzmq with libsodium)"
        )


def _hub_curve_keys(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """The hub's CURVE ``(public, secret)`` key pair (Z85) from a file as ``tensorwire certs``
    writes ``hub.curve``: the public key, then the secret key, one per line."""
    p = Path(path)
    lines = _key_lines(p, "the hub's CURVE key pair")
    if len(lines) < 2:
        raise TransportError(
            f"{p} holds no CURVE key pair: expected the public key, then the secret key, one "
            "per line (tensorwire certs writes hub.curve)"
        )
    public = _z85_key(lines[0], f"line 1 of {p}")
    secret = _z85_key(lines[1], f"line 2 of {p}")
    if zmq.curve_public(secret) != public:
        raise TransportError(f"{p}: the public key on line 1 is not that of the secret key")
    return public, secret


def _hub_public_key(path: str | os.PathLike[str]) -> bytes:
    """The hub's CURVE public key (Z85): the first line of ``path`` (``hub.curve.pub``, or
    ``hub.curve``)."""
    p = Path(path)
    lines = _key_lines(p, "the hub's CURVE public key")
    if not lines:
        raise TransportError(f"{p} is empty: expected the hub's CURVE public key")
    return _z85_key(lines[0], f"line 1 of {p}")


def _hub_curve_file(curve: str | os.PathLike[str] | None, tls: TLS | None) -> Path:
    """The file of the hub's CURVE key pair: ``curve``, else ``hub.curve`` beside the TLS
    certificate."""
    if curve is not None:
        return Path(curve)
    if tls is None or tls.cert is None:
        raise TransportError(
            "a zmq+tcp:// hub encrypts with CURVE: name its key pair with curve=FILE "
            "(tensorwire certs writes hub.curve), or give tls=TLS(cert=...) with hub.curve "
            "beside the certificate"
        )
    return Path(tls.cert).parent / "hub.curve"


def _client_curve_file(curve: str | os.PathLike[str] | None, tls: TLS | None) -> Path:
    """The file whose first line is the hub's CURVE public key: ``curve``, else
    ``hub.curve.pub`` beside the TLS CA, else ``hub.curve`` there."""
    if curve is not None:
        return Path(curve)
    if tls is None or tls.ca is None:
        raise TransportError(
            "a zmq+tcp:// channel encrypts with CURVE and needs the hub's public key: "
            "curve=FILE (tensorwire certs writes hub.curve.pub), or tls=TLS(ca=...) with "
            "hub.curve.pub beside the CA"
        )
    directory = Path(tls.ca).parent
    public, pair = directory / "hub.curve.pub", directory / "hub.curve"
    if public.is_file() or not pair.is_file():
        return public
    # It works, but a device that holds hub.curve holds the hub's secret key too.
    _log_limited(
        f"zmq curve {pair}",
        f"zmq: reading the hub's public key from {pair}, which also holds the hub's SECRET "
        "key: give devices hub.curve.pub only (tensorwire certs writes it)",
    )
    return pair


def _endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _configure(sock: zmq.Socket, host: str) -> None:
    sock.linger = 0
    sock.sndhwm = QUEUE_PIECES  # a full queue makes a send wait, then time out: never unbounded
    sock.rcvhwm = QUEUE_PIECES
    sock.maxmsgsize = MAX_FRAME_BYTES
    sock.heartbeat_ivl = HEARTBEAT_IVL_MS
    sock.heartbeat_timeout = HEARTBEAT_TIMEOUT_MS
    sock.ipv6 = ":" in host


def _waker() -> tuple[socket.socket, socket.socket]:
    """A socketpair whose read end a waiting reader polls, so other threads can wake it."""
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    return r, w


def _wake(w: socket.socket) -> None:
    with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or already closed
        w.send(b"\0")


def _drain(r: socket.socket) -> None:
    """Take the pending wake-ups: one read (more than WAKE_BYTES left wake the next poll)."""
    with contextlib.suppress(OSError):
        r.recv(WAKE_BYTES)


def _poller(*fds: int) -> select.poll:
    """A ``poll`` object on ``fds`` (readable): one system call per wait, where a
    ``zmq.Poller`` asks libzmq for every socket's events before and after it."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return poller


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
# Below it a frame is copied into libzmq's message (as pyzmq does with copy=False too): cheaper
# than a zero-copy frame, whose release goes through pyzmq's garbage-collector thread.
_COPY_BYTES = zmq.COPY_THRESHOLD


def _frames(marker: bytes, batch: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """``batch`` as frames: each buffer from pyzmq's copy threshold up zero-copy on its own,
    each run of smaller ones joined into one (pyzmq would copy them anyway), the marker first."""
    threshold = _COPY_BYTES
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


def _pieces(enc: EncodedMessage) -> Iterator[list[bytes | memoryview]]:
    """``enc`` as the frames of its ZeroMQ messages, in order (see the module doc)."""
    if enc.nbytes < _COPY_BYTES:  # one frame, which libzmq copies: join it in one go
        yield [b"".join([START, *enc.frames()])]
        return
    marker = START
    for batch in _batches(enc):
        yield _frames(marker, batch)
        marker = MORE


class _SharedPieces:
    """The pieces of one message, made on first use and kept for every client a broadcast
    sends them to: digests are computed and small buffers joined once."""

    def __init__(self, enc: EncodedMessage) -> None:
        self._source = _pieces(enc)
        self._made: list[list[bytes | memoryview]] = []

    def get(self, i: int) -> list[bytes | memoryview] | None:
        """Piece ``i``, or None past the last one."""
        while i >= len(self._made):
            piece = next(self._source, None)
            if piece is None:
                return None
            self._made.append(piece)
        return self._made[i]


def _queue_piece(
    sock: zmq.Socket,
    piece: list[bytes | memoryview],
    trackers: list[zmq.MessageTracker],
    envelope: bytes | None = None,
) -> bool:
    """Queue one ZeroMQ message ``[envelope, *piece]`` without blocking; False (nothing queued)
    if the peer's queue is full, or for a DEALER, not connected.

    Frames under pyzmq's copy threshold are copied; bigger ones are shared with libzmq
    (zero-copy), and for those that may be the caller's memory (anything but ``bytes``) the
    trackers go to ``trackers``: the caller waits on them before the arrays may change.
    libzmq checks the high-water mark only at a message's first frame, so only that one can
    find the queue full.
    """
    parts = piece if envelope is None else [envelope, *piece]
    last = len(parts) - 1
    for i, part in enumerate(parts):
        flags = _SEND_MORE if i < last else _SEND_LAST
        try:
            if len(part) < _COPY_BYTES:
                sock.send(part, flags)
                continue
            mine = isinstance(part, bytes)  # immutable: nobody can change it while queued
            tracker = sock.send(part, flags, copy=False, track=not mine)
        except zmq.Again:
            if i:
                raise
            return False
        if tracker is not None and not tracker.done:
            trackers.append(tracker)
    return True


def _readable(sock: zmq.Socket) -> bool:
    """Whether ``sock`` holds a message, without raising as a failed read does. libzmq takes
    the socket's pending commands first, so when it says no, the socket's FD is armed: it
    signals the next change (ZMQ_FD is edge-triggered)."""
    return bool(sock.get(_EVENTS) & _POLLIN)  # type: ignore[operator]  # typed int | bytes


def _recv_frames(sock: zmq.Socket) -> list[zmq.Frame]:
    """The frames of the ZeroMQ message ``sock`` holds (call after :func:`_readable`)."""
    frame = sock.recv(zmq.NOBLOCK, copy=False)
    frames = [frame]
    while frame.more:  # set by pyzmq from ZMQ_RCVMORE, without a getsockopt call of ours
        frame = sock.recv(zmq.NOBLOCK, copy=False)
        frames.append(frame)
    return frames


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
        self._limits = limits
        self._stream = self._new_stream()

    def _new_stream(self) -> MessageStream:
        return MessageStream(limits=self._limits, codec_lookup=get_codec)

    def set_limits(self, limits: Limits) -> None:
        """Read the messages after the current one under ``limits`` (a stranger became a member)."""
        self._limits = self._stream.limits = limits

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
        marker = head[:1]
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
        stream = self._stream
        try:
            if len(frames) == 1 and marker == START:  # most likely a whole small message
                msg = stream.receive_one(head[1:])
                if msg is not None:
                    if events:
                        events.append(msg)
                        return events
                    return [msg]
            else:
                step = stream.max_read
                for view in (head[1:], *(f.buffer for f in frames[1:])):
                    for start in range(0, len(view), step):
                        stream.receive_data(view[start : start + step])
        except WireError as exc:  # framing lost: drop this message, resume at the next START
            self._stream = self._new_stream()
            events.append(exc)
            return events
        while True:
            try:
                event = stream.next_event()
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


@dataclass(eq=False)
class _Peer:
    """A client whose hello the hub welcomed, on the connection it came on."""

    client_id: str
    ident: bytes  # its routing id: the session id of its hello
    fd: int  # the hub's file descriptor of its connection
    session: HubSession
    reader: _Reassembler


@dataclass(eq=False)
class _Outbound:
    """One client's progress through a message the hub sends."""

    client_id: str
    ident: bytes | None = None  # its routing id, looked up as the first piece is queued
    next: int = 0  # index of the next piece to queue
    done: bool = False  # every piece is queued
    trackers: list[zmq.MessageTracker] = field(default_factory=list)
    released: int = 0  # trackers before this one are done


def _wait_for_room(pending: list[_Outbound], nap: float, left: float | None) -> None:
    """Wait until a full queue may have room: libzmq frees half a queue at a time, so until
    it wrote the zero-copy frame about half a queue after the oldest one still queued for one
    of ``pending``; or for ``nap`` seconds if all their queued frames were copies (no tracker
    says when those leave). Never past ``left`` seconds."""
    for out in pending:
        while out.released < len(out.trackers) and out.trackers[out.released].done:
            out.released += 1
        if out.released < len(out.trackers):
            target = min(out.released + QUEUE_PIECES // 2, len(out.trackers) - 1)
            longest = FULL_WAIT_S[1]
            with contextlib.suppress(zmq.NotDone):
                out.trackers[target].wait(longest if left is None else min(longest, left))
            return
    time.sleep(nap if left is None else min(nap, left))


class ZmqHub(Hub):
    """Hub on ``zmq+tcp://host:port`` (port 0 picks a free one; see :attr:`url`).

    With ``tls=`` or ``curve=`` (a file: the hub's CURVE public key, then its secret key, one
    per line; default ``hub.curve`` beside ``tls.cert``; also the URL option ``?curve=``)
    every connection is encrypted with CURVE. Clients are identified by ``auth=`` (their
    enrolled secrets); ``tls.ca`` without them is refused (CURVE cannot check certificates).

    ``on_join`` / ``on_leave`` run on the thread that reads the ROUTER (the hub's reader
    thread, or one in :meth:`recv`): while they run no message is read, so keep them short
    (sending from them is fine).
    """

    protocol = "zmq"

    def __init__(
        self, url: str, *, curve: str | os.PathLike[str] | None = None, **options: Any
    ) -> None:
        super().__init__(**options)
        curve = _one_curve_option(url, curve)
        host, port = host_port(url, default_port=0)
        self._curve = self.tls is not None or curve is not None
        keys = self._curve_keys(curve) if self._curve else None
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        _configure(self._router, host)
        self._router.router_mandatory = 1  # a send to a gone client raises, a full queue EAGAIN
        self._router.router_handover = 0  # a routing id in use is never given to another peer
        if keys is not None:
            # No ZAP handler: any client key completes the handshake; the hello's proof of
            # the device's secret is what admits it.
            self._router.curve_server = 1
            self._router.curve_publickey, self._router.curve_secretkey = keys
        self._monitor = self._router.get_monitor_socket(_MONITOR_EVENTS)
        try:
            self._router.bind(_endpoint(host, port or "*"))
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            raise TransportError(f"cannot listen on {url}: {exc}") from None
        self.url = "zmq+" + cast(bytes, self._router.last_endpoint).decode()
        self._lock = threading.Lock()  # whoever holds it may use the ROUTER (and _route)
        self._stopping = False
        self._polling = False  # a reader may wait on the ROUTER's FD (guarded by _lock)
        self._route: dict[str, bytes] = {}  # client id -> routing id of its current session
        # Who reads the ROUTER: whoever holds _reading (the reader thread or a recv caller).
        self._reading = threading.Lock()
        self._turns_lock = threading.Lock()  # guards the three below
        self._parked = threading.Condition(self._turns_lock)  # the reader thread waits here
        self._thread_reads = False  # the reader thread holds _reading
        self._callers = 0  # recv calls that read, or wait to
        self._callers_left_at = 0.0  # time.monotonic() when the last one stopped reading
        # Owned by whoever reads:
        self._peers: dict[bytes, _Peer] = {}  # routing id -> its session
        self._strangers: dict[bytes, _Reassembler] = {}  # no session, a message unfinished
        self._on_fd: dict[int, bytes] = {}  # fd of a session's connection -> its routing id
        self._closing: list[_Peer] = []  # sessions whose connection closed, not yet left
        self._monitor_due = True  # its FD signals only after a read found it empty: read it
        self._wake_r, self._wake_w = _waker()
        self._monitor_fd, self._wake_fd = self._monitor.fileno(), self._wake_r.fileno()
        self._poll = _poller(self._router.fileno(), self._monitor_fd, self._wake_fd)
        self._io = threading.Thread(target=self._run, name="tensorwire-zmq-hub", daemon=True)
        self._io.start()

    def _curve_keys(self, curve: str | os.PathLike[str] | None) -> tuple[bytes, bytes]:
        """The CURVE key pair, after checking that the credentials asked for can be checked."""
        _check_curve_available()
        auth = self.authenticate
        if self.tls is not None and self.tls.ca is not None:
            if auth is None or (isinstance(auth, KeyAuthenticator) and auth.keys is None):
                raise TransportError(
                    "zmq+tcp:// cannot check client certificates (CURVE has no X.509), so a "
                    "hub with ca= and no enrolled keys would admit anyone: identify devices by "
                    "their secrets with auth=keys.json (tensorwire certs writes it), or drop ca="
                )
            log.info(
                "zmq: client certificates are not checked over CURVE (ca= is unused): devices "
                "are identified by their enrolled secrets"
            )
        return _hub_curve_keys(_hub_curve_file(curve, self.tls))

    # -- reading: the reader thread, or a thread in recv --------------------------------

    def recv(self, timeout: float | None = None) -> tuple[str, Message]:
        """The next message from any client, as ``(client_id, message)``.

        The calling thread reads the ROUTER itself (no hand-off from the reader thread, which
        stays away while recv is called, and for CALLER_LINGER_S after); a second caller
        waits for its turn, or for a message the first one read.
        """
        deadline = None if timeout is None else time.monotonic() + timeout  # deadline_after
        if self._inbox:  # a look without the lock; taken under it
            with self._cond:
                if self._inbox:
                    return self._inbox.popleft()
        with self._turns_lock:
            self._callers += 1
            if self._thread_reads:
                _wake(self._wake_w)  # out of its poll: it gives way to callers
        try:
            left = -1 if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not self._reading.acquire(timeout=left):
                raise TransportTimeout(f"no message within {timeout} s")
            try:
                return self._read_for_caller(deadline, timeout)
            finally:
                self._polling = False  # nobody waits on the FD until the next read
                self._reading.release()  # the next caller's turn
        finally:
            with self._turns_lock:
                self._callers -= 1
                self._callers_left_at = time.monotonic()

    def _read_for_caller(
        self, deadline: float | None, timeout: float | None
    ) -> tuple[str, Message]:
        """Read the ROUTER in a ``recv`` (``_reading`` held) until a message is in."""
        while True:
            if self._inbox:  # the caller before us, or the reader thread, read it
                with self._cond:
                    if self._inbox:
                        return self._inbox.popleft()
            if self._stopping:
                raise TransportTimeout(f"no message within {timeout} s: the hub is closed")
            got = self._read_step(1, take=True)  # one at a time: return what it brings
            if isinstance(got, tuple):
                return got
            if got:  # the ROUTER was empty
                left = remaining(deadline)
                if left == 0.0:
                    raise TransportTimeout(f"no message within {timeout} s")
                self._wait(left)

    def _run(self) -> None:
        """The reader thread: reads the ROUTER while no recv caller does."""
        while True:
            with self._turns_lock:
                while not self._stopping:
                    # Callers do not wake it when they stop: it looks again every linger.
                    if self._callers:
                        self._parked.wait(CALLER_LINGER_S)
                        continue
                    idle = time.monotonic() - self._callers_left_at
                    if idle >= CALLER_LINGER_S and self._reading.acquire(False):
                        self._thread_reads = True
                        break
                    self._parked.wait(max(CALLER_LINGER_S - idle, 0.001))
                if self._stopping:
                    return
            try:
                while not (self._callers or self._stopping):
                    if self._read_step(READ_BATCH) and not (self._callers or self._stopping):
                        self._wait(None)
            except Exception:  # serve on: the next read may do better
                log.exception("zmq: the hub's reader thread failed a read")
            finally:
                with self._turns_lock:
                    self._thread_reads = False
                    self._polling = False  # nobody waits on the FD until the next read
                    self._reading.release()

    def _read_step(self, limit: int, take: bool = False) -> bool | tuple[str, Message]:
        """Read and handle up to ``limit`` messages; True if the ROUTER was found empty and no
        closed connection waits for another read (then wait before the next step). ``take``
        (a recv caller): return the first data message read instead of queueing it."""
        if self._monitor_due:
            self._monitor_due = False
            self._read_monitor()
        closed_before_read = len(self._closing)
        batch, more = self._read_batch(limit)
        got = None
        for frames in batch:
            ident = frames[0].bytes
            try:
                got = self._on_message(ident, frames[1:], take and got is None) or got
            except Exception:  # e.g. an on_join callback that raised: serve the others
                log.exception("zmq: handling a message from %r failed", _peer_name(ident))
        del batch  # hand libzmq its buffers back before waiting
        if got is not None:
            return got
        if more:
            return False
        if closed_before_read:  # the ROUTER was empty: it held their last messages
            self._forget_closed(closed_before_read)
        return not self._closing

    def _wait(self, seconds: float | None) -> None:
        """Wait until the ROUTER or its monitor may have news, a wake-up, or ``seconds``.

        ZMQ_FD is edge-triggered: wait on it only after the ROUTER was found empty; a sender
        that may have consumed its edge meanwhile wakes us instead (_check_readable)."""
        for fd, _ in self._poll.poll(None if seconds is None else int(seconds * 1000) + 1):
            if fd == self._monitor_fd:
                self._monitor_due = True
            elif fd == self._wake_fd:
                _drain(self._wake_r)

    def _read_batch(self, limit: int) -> tuple[list[list[zmq.Frame]], bool]:
        """Up to ``limit`` messages, and whether more may be waiting (not found empty)."""
        batch: list[list[zmq.Frame]] = []
        with self._lock:
            self._polling = False
            if self._stopping:
                return batch, False
            router = self._router
            for _ in range(limit):
                if not router.get(_EVENTS) & _POLLIN:  # type: ignore[operator]  # _readable
                    self._polling = True
                    return batch, False
                batch.append(_recv_frames(router))
        return batch, True

    def _check_readable(self) -> None:
        """After using the ROUTER (lock held): wake a reader that may wait on its FD if that
        use consumed the FD's edge (a send can process the ROUTER's pending commands)."""
        if self._polling and _readable(self._router):
            _wake(self._wake_w)

    def _read_monitor(self) -> None:
        """Note connections that closed; called before every hello is accepted. Handshakes
        that failed are refusals.

        Their clients stay members until :meth:`_forget_closed`: messages they sent before
        closing may still be queued on the ROUTER.
        """
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] != zmq.EVENT_DISCONNECTED:
                error = self._handshake_error(event["event"], event["value"])
                self._refused(f"a peer of {self.url}", error)
                continue
            fd = int(event["value"])
            ident = self._on_fd.pop(fd, None)  # now, as a new connection may reuse the fd
            peer = None if ident is None else self._peers.get(ident)
            if peer is not None and peer.fd == fd:
                self._closing.append(peer)

    def _handshake_error(self, event: int, code: int) -> TransportError:
        """Why a peer's ZMTP handshake failed (``code``: libzmq's protocol error or errno)."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            # What a client does when it finds out first that the encryption does not match
            # (and what a TCP probe does).
            return TransportError(
                "it closed the connection during the ZMTP handshake (a client "
                + ("without CURVE encryption?)" if self._curve else "expecting CURVE?)")
            )
        if code == _MECHANISM_MISMATCH and self._curve:
            return AuthenticationError("it connected without CURVE encryption")
        if code == _MECHANISM_MISMATCH:
            return AuthenticationError("it asked for encryption; this hub has no CURVE keys")
        if code == _CRYPTOGRAPHIC:
            # libzmq then stops reading that connection; ZMTP heartbeats close it.
            return AuthenticationError(
                "a CURVE box it sent did not open: it does not know this hub's public key, or "
                "its traffic was altered on the way"
            )
        return TransportError(f"{_protocol_error(code)} on its connection")

    def _forget_closed(self, n: int) -> None:
        """The first ``n`` closed connections' clients leave, unless they said goodbye or
        reconnected meanwhile; call only once the ROUTER was read empty after noting them."""
        closed, self._closing = self._closing[:n], self._closing[n:]
        for peer in closed:
            if self._peers.get(peer.ident) is peer:
                try:
                    self._end(peer, "connection lost")
                except Exception:  # an on_leave callback that raised: the others still leave
                    log.exception("zmq: ending the session of %r failed", peer.client_id)

    def _on_message(
        self, ident: bytes, frames: list[zmq.Frame], take: bool = False
    ) -> tuple[str, Message] | None:
        """Act on one ZeroMQ message from ``ident``. ``take``: return the first data message
        it completes (as :meth:`_take_delivered`) instead of queueing it."""
        got = None
        peer = self._peers.get(ident)
        reader = peer.reader if peer is not None else self._stranger(ident)
        for event in reader.feed(frames):
            if isinstance(event, WireError):
                self._rejected(peer.client_id if peer else self._who(ident, frames), event)
            elif peer is None:
                peer = self._open(ident, event, frames, reader)
            elif event.kind == "data" and peer.session.state is State.OPEN:  # Data, unmade
                if take and got is None:
                    got = self._take_delivered(peer.client_id, event)
                else:
                    self._delivered(peer.client_id, event)
            else:
                outcome = peer.session.receive(event)
                if isinstance(outcome, Data):
                    self._delivered(peer.client_id, event)
                elif isinstance(outcome, Closed):
                    self._end(peer, outcome.reason)
                    peer = None
                else:
                    log.debug("zmq: %r: %s", peer.client_id, outcome)
        if peer is None and not reader.in_message:
            self._strangers.pop(ident, None)  # strangers keep no state between their messages
        return got

    def _stranger(self, ident: bytes) -> _Reassembler:
        """The reader of a peer without a session: a stranger's first message is read under
        HELLO_LIMITS, and at most MAX_STRANGERS unfinished ones are kept."""
        reader = self._strangers.get(ident)
        if reader is None:
            if len(self._strangers) >= MAX_STRANGERS:
                oldest = next(iter(self._strangers))
                del self._strangers[oldest]
                self._rejected(
                    f"routing id {_peer_name(oldest)}",
                    TruncatedMessage("dropped its unfinished message: too many strangers at once"),
                )
            reader = self._strangers[ident] = _Reassembler(HELLO_LIMITS)
        return reader

    @staticmethod
    def _who(ident: bytes, frames: list[zmq.Frame]) -> str:
        """A peer without a session, for logs: its address and routing id."""
        try:
            address = frames[0].get("Peer-Address")
        except zmq.ZMQError:
            address = "?"
        return f"{address} (routing id {_peer_name(ident)})"

    def _open(
        self, ident: bytes, msg: Message, frames: list[zmq.Frame], reader: _Reassembler
    ) -> _Peer | None:
        """Act on a message from a routing id without a session: welcome a valid hello (and
        return the new member), refuse a bad one, answer anything else with bye."""
        who = self._who(ident, frames)
        if msg.kind != "hello":
            self._rejected(who, SessionRefused(f"a {msg.kind!r} message outside a session"))
            if msg.kind != "bye":
                self._say(ident, bye("no session on this connection: say hello first"), "bye")
            return None
        options = self._session_options()
        authenticate = options["authenticate"]

        def check(hello: Hello, tls_name: str | None) -> tuple[Mapping[str, Any], bytes | None]:
            if hello.session.encode() != ident or len(hello.session) < MIN_SESSION_CHARS:
                raise SessionRefused(
                    f"the ZeroMQ routing id must be the hello's session id, {MIN_SESSION_CHARS} "
                    f"or more random characters (routing id {_peer_name(ident)!r}, session "
                    f"{hello.session!r})"
                )
            return ({}, None) if authenticate is None else authenticate(hello, tls_name)

        session = HubSession(**{**options, "authenticate": check})
        try:
            session.receive(msg)
        except SessionRefused as exc:
            self._say(ident, session.refusal(exc), "refuse")
            self._refused(who, exc)
            return None
        hello = session.hello
        assert hello is not None
        self._read_monitor()  # closed connections first: the fd of this hello may be reused
        if not self._say(ident, session.welcome(), "welcome"):
            self._refused(who, TransportError("its queue is full: it reads nothing"))
            return None
        self._strangers.pop(ident, None)
        reader.set_limits(self.limits)  # a member: its messages may be as large as ours
        peer = _Peer(hello.client_id, ident, frames[-1].get(zmq.SRCFD), session, reader)
        with self._lock:
            old = self._route.get(peer.client_id)
            self._route[peer.client_id] = ident
        if old is not None:
            self._peers.pop(old, None)  # its later messages get a bye: the session is over
        self._peers[ident] = peer
        self._on_fd[peer.fd] = ident
        self._joined(
            peer.client_id,
            hello.decoders,
            session=peer,
            max_message_bytes=hello.max_message_bytes,
        )
        return peer

    def _end(self, peer: _Peer, reason: str) -> None:
        """``peer``'s session is over (it said goodbye, or its connection closed)."""
        del self._peers[peer.ident]
        if self._on_fd.get(peer.fd) == peer.ident:
            del self._on_fd[peer.fd]
        with self._lock:
            if self._route.get(peer.client_id) == peer.ident:
                del self._route[peer.client_id]
        self._left(peer.client_id, reason, session=peer)

    def _say(self, ident: bytes, enc: EncodedMessage, what: str) -> bool:
        """Queue a control message if the peer's queue has room (never waits: the reader
        thread sends these); False if it could not."""
        trackers: list[zmq.MessageTracker] = []
        with self._lock:
            try:
                queued = not self._stopping and all(
                    _queue_piece(self._router, piece, trackers, ident) for piece in _pieces(enc)
                )
                why = "its queue is full"
            except zmq.ZMQError as exc:
                queued, why = False, str(exc)
            finally:
                self._check_readable()
        if not queued:  # debug: a stranger's junk is logged (rate-limited) by _rejected
            log.debug("zmq: could not send %s to %s: %s", what, _peer_name(ident), why)
        return queued

    # -- sending, from any thread ------------------------------------------------------

    def _push(self, out: _Outbound, pieces: _SharedPieces) -> int:
        """Queue ``out``'s next pieces until they are all queued or its queue is full; return
        how many were queued. One hold of the ROUTER lock: the reader wakes once, not per piece.
        """
        queued = 0
        with self._lock:
            if self._stopping:
                raise PeerGone("the hub is closed")
            if out.ident is None:  # the client's session when the send began, for all pieces
                out.ident = self._route.get(out.client_id)
                if out.ident is None:
                    raise PeerGone(f"client {out.client_id!r} is not connected")
            try:
                while (piece := pieces.get(out.next)) is not None:
                    if not _queue_piece(self._router, piece, out.trackers, out.ident):
                        return queued
                    out.next += 1
                    queued += 1
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    raise PeerGone(f"client {out.client_id!r} is not connected") from None
                raise TransportError(f"zmq: sending to {out.client_id!r}: {exc}") from None
            finally:
                self._check_readable()
        out.done = True
        return queued

    def _deliver(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Queue ``enc`` for every client, round robin so that a full queue (a slow client)
        holds up only its own send, then wait until libzmq released each one's zero-copy
        frames. Returns each client's seconds from the start, or the error its send ended with.
        """
        t = time.perf_counter()
        results: dict[str, float | Exception] = {}
        pending = [_Outbound(c) for c in clients]
        queued: list[_Outbound] = []
        pieces = _SharedPieces(enc)
        nap = FULL_WAIT_S[0]
        while pending:
            progressed = False
            for out in pending:
                try:
                    progressed = self._push(out, pieces) > 0 or progressed
                except TransportError as exc:
                    results[out.client_id] = exc
            queued += [out for out in pending if out.done]
            pending = [out for out in pending if not out.done and out.client_id not in results]
            left = remaining(deadline)
            if not pending:
                break
            if left == 0.0:
                for out in pending:
                    results[out.client_id] = TransportTimeout(
                        f"client {out.client_id!r} took no more messages within the timeout "
                        f"(its queue of {QUEUE_PIECES} pieces stayed full: sent "
                        f"{out.next} of the message's pieces)"
                    )
                break
            nap = FULL_WAIT_S[0] if progressed else min(2 * nap, FULL_WAIT_S[1])
            _wait_for_room(pending, nap, left)
        for out in queued:
            try:
                _wait_released(out.trackers[out.released :], deadline, repr(out.client_id))
                results[out.client_id] = time.perf_counter() - t
            except TransportError as exc:
                results[out.client_id] = exc
        return results

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        if enc.nbytes < _COPY_BYTES and self._queue_small(client_id, enc):
            return
        result = self._deliver([client_id], enc, deadline)[client_id]
        if isinstance(result, Exception):
            raise result

    def _queue_small(self, client_id: str, enc: EncodedMessage) -> bool:
        """Queue a message that goes as one copied frame, if the client's queue has room: no
        trackers to wait on, nothing to share. False to leave it to :meth:`_deliver`, which
        also says why a send fails."""
        frame = b"".join([START, *enc.frames()])  # next(_pieces(enc)), without the generator
        with self._lock:
            ident = None if self._stopping else self._route.get(client_id)
            if ident is None:
                return False
            try:  # as _queue_piece: libzmq checks the queue's room at the first frame only
                self._router.send(ident, _SEND_MORE)
                self._router.send(frame, _SEND_LAST)
                return True
            except zmq.ZMQError:  # a full queue or a gone client fail the first frame
                return False
            finally:
                if self._polling:
                    self._check_readable()

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Queue the message for every client from this thread; libzmq's I/O thread writes."""
        return self._deliver(clients, enc, deadline)

    def _close_transport(self) -> None:
        with self._lock:
            self._stopping = True
        with self._turns_lock:
            self._parked.notify_all()
        _wake(self._wake_w)  # out of its poll, whoever reads
        stopped = self._reading.acquire(timeout=10)
        if stopped:  # callers waiting for a turn take it, and find the hub closed
            self._reading.release()
        self._io.join(timeout=10)
        if not stopped or self._io.is_alive():
            log.error("zmq: the hub's reader did not stop; leaving its sockets open")
            return
        goodbye = next(_pieces(bye("the hub is closing")))
        trackers: list[zmq.MessageTracker] = []
        with self._lock:
            for ident in self._peers:
                with contextlib.suppress(zmq.ZMQError):  # gone, or its queue is full
                    _queue_piece(self._router, goodbye, trackers, ident)
        self._router.disable_monitor()
        self._monitor.close(linger=0)
        self._router.close(linger=int(BYE_TIMEOUT * 1000))
        self._ctx.term()  # returns once the byes are out, or after BYE_TIMEOUT
        self._wake_r.close()
        self._wake_w.close()


class _Turns:
    """One thread at a time on a channel's sockets: ``with turns:``, or on the hot paths
    ``lock.acquire(False)`` and :meth:`wait_turn` when that fails, then ``lock.release()`` (a
    plain lock: no Python frames when uncontended). A thread that finds them taken calls
    ``wake`` (the holder may wait in ``poll``); the holder, woken, lets it go first
    (:meth:`step_aside`), so a channel used from one thread pays no hand-off."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.lock = threading.Lock()  # held by the thread using the sockets
        self._cv = threading.Condition(threading.Lock())  # guards _waiting
        self._waiting = 0  # threads that want the sockets
        self._wake = wake

    def __enter__(self) -> None:
        if not self.lock.acquire(False):
            self.wait_turn()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()

    def wait_turn(self) -> None:
        """Take the sockets from the thread that holds them (``lock`` acquired on return)."""
        with self._cv:
            self._waiting += 1
        try:
            self._wake()
            self.lock.acquire()
        finally:
            with self._cv:
                self._waiting -= 1
                self._cv.notify_all()

    def step_aside(self) -> None:
        """Give the sockets to the threads waiting for them; take them back after."""
        self.lock.release()
        try:
            with self._cv:
                while self._waiting:  # each one counts itself out once it holds the lock
                    self._cv.wait()
        finally:
            self.lock.acquire()


class ZmqChannel(Channel):
    """A client's DEALER connected to a :class:`ZmqHub`; waits up to ``timeout`` seconds for it.

    With ``tls=`` or ``curve=`` (a file whose first line is the hub's CURVE public key;
    default ``hub.curve.pub`` beside ``tls.ca``, else ``hub.curve`` there; also the URL option
    ``?curve=``) the connection is encrypted with CURVE, under a fresh client key pair per
    connection. ``key=`` is this device's enrolled secret (bytes, hex, or a file of hex),
    proven in the hello; ``tls.cert`` is not used (CURVE has no certificates).
    """

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
        tls: TLS | None = None,
        key: Any = None,
        curve: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(codec, checksum, limits)
        curve = _one_curve_option(url, curve)
        self.url = url
        self.client_id = client_id or default_client_id()
        self._host, self._port = host_port(url)
        self._credentials(tls, key)
        self._hub_key: bytes | None = None  # the hub's CURVE public key (Z85): encrypt
        self._curve_file: Path | None = None
        if tls is not None or curve is not None:
            _check_curve_available()
            self._curve_file = _client_curve_file(curve, tls)
            self._hub_key = _hub_public_key(self._curve_file)
        self._owning = _Turns(lambda: _wake(self._wake_w))  # who uses the sockets
        self._pending: deque[Message | WireError] = deque()
        self._closed = True
        self._refusal: TransportError | None = None  # why this connection's handshake failed
        self._welcomed = False  # this connection's session is open
        self._handshake_resets = 0  # handshakes the hub closed in this reconnect's attempts
        self.reconnect(timeout)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)connect to the hub and say hello with the same client id, in a new session."""
        if not self._closed:
            self._drop()
        self._handshake_resets = 0
        welcome = dial(self._open, what=f"the hub at {self.url}", timeout=timeout)
        self.hub_decoders = welcome.decoders
        self.hub_max_bytes = welcome.max_message_bytes

    def _open(self, deadline: float | None) -> Welcomed:
        """One attempt: a DEALER whose routing id is a new session's id, its hello, the
        hub's welcome. ``TransportTimeout`` if no connection within CONNECT_ATTEMPT_S."""
        session = self._client_session(f"the hub at {self.url}")
        self._start(session.session.encode())
        try:
            attempt = deadline_after(CONNECT_ATTEMPT_S)
            with self._owning:
                try:
                    self._wait_writable(attempt if deadline is None else min(deadline, attempt))
                except TransportTimeout:
                    raise TransportTimeout(f"no connection to {self.url} yet") from None
            self._send_encoded(session.hello(), deadline)
            welcome = session.receive(self._next_message(deadline, None))
            while not isinstance(welcome, Welcomed):  # a welcome for an earlier session
                welcome = session.receive(self._next_message(deadline, None))
        except BaseException:
            self._drop()
            raise
        self._session = session
        self._welcomed = True
        return welcome

    def _start(self, routing_id: bytes) -> None:
        """New sockets, connecting to the hub (in the background: libzmq retries)."""
        with self._owning:
            self._ctx = zmq.Context()
            self._dealer = self._ctx.socket(zmq.DEALER)
            _configure(self._dealer, self._host)
            self._dealer.routing_id = routing_id
            self._dealer.immediate = 1  # nothing queued for a connection that is not up
            if self._hub_key is not None:
                # A fresh key pair: the hub admits a device by its hello's proof, not its key.
                public, secret = zmq.curve_keypair()
                self._dealer.curve_serverkey = self._hub_key
                self._dealer.curve_publickey = public
                self._dealer.curve_secretkey = secret
            self._monitor = self._dealer.get_monitor_socket(_MONITOR_EVENTS)
            self._wake_r, self._wake_w = _waker()
            self._monitor_fd, self._wake_fd = self._monitor.fileno(), self._wake_r.fileno()
            self._poll_in = _poller(self._dealer.fileno(), self._monitor_fd, self._wake_fd)
            self._poll_out = _poller(self._dealer.fileno(), self._monitor_fd)
            self._reader = _Reassembler(self.limits)
            self._pending.clear()
            self._closed = self._lost = self._welcomed = False
            self._refusal = None
            # A socket's FD signals only after a read found it empty: arm the monitor's.
            self._read_monitor()
            try:
                self._dealer.connect(_endpoint(self._host, self._port))
            except zmq.ZMQError as exc:
                self._teardown(0.0)
                raise TransportError(f"cannot connect to {self.url}: {exc}") from None

    # -- one thread at a time on the sockets -------------------------------------------

    def _step_aside(self) -> None:
        """Called by the owner when woken: let the threads that asked go first."""
        _drain(self._wake_r)
        self._owning.step_aside()

    def _check_usable(self) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        if self._refusal is not None:  # before _lost: the connection closed because of it
            raise self._refusal
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
            elif self._welcomed and not self._lost:
                # A CURVE message that does not open (altered on the way): libzmq reports it
                # but then stops reading the connection without closing it.
                log.warning(
                    "zmq: the connection to the hub at %s is lost: a message failed ZMTP's "
                    "checks (%s; with CURVE: altered on the way?)",
                    self.url,
                    _protocol_error(event["value"]),
                )
                self._lost = True
            elif not self._lost:  # libzmq's own reconnects after a loss do not matter
                self._refusal = self._refusal or self._handshake_error(
                    event["event"], event["value"]
                )

    def _handshake_error(self, event: int, code: int) -> TransportError:
        """What a failed ZMTP handshake means: :class:`AuthenticationError` (final: ``dial``
        does not retry it) when the two sides' encryption does not match, else a
        ``TransportError`` that ``dial`` retries."""
        where = f"the hub at {self.url}"
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if code == _MECHANISM_MISMATCH and self._hub_key is not None:
                return AuthenticationError(
                    f"{where} does not encrypt (no CURVE), and this channel does not talk in "
                    "clear: serve it with tls= and its CURVE keys, or connect without tls=/curve="
                )
            if code == _MECHANISM_MISMATCH:
                return AuthenticationError(f"{where} requires CURVE encryption: {_CURVE_HINT}")
            if code == _CRYPTOGRAPHIC:
                return AuthenticationError(
                    f"{where} failed the CURVE handshake: it does not hold the secret key of "
                    f"the public key in {self._curve_file}"
                )
            return TransportError(f"the handshake with {where} failed: {_protocol_error(code)}")
        # The hub closed the connection during the handshake. A CURVE hub does so when our
        # hello box does not open (the wrong public key), and on a client without CURVE; a hub
        # without CURVE on a CURVE client. If the close reset the connection before the hub's
        # greeting was read, libzmq cannot say which; a hub whose encryption matches never
        # closes a handshake, so a few in a row tell.
        self._handshake_resets += 1
        n = self._handshake_resets
        error = AuthenticationError if n >= HANDSHAKE_RESETS else TransportError
        if self._hub_key is not None:
            return error(
                f"{where} ended the CURVE handshake {n} time(s): its key is not the public key "
                f"in {self._curve_file} (the wrong hub, or a stale key file?), or it does not "
                "encrypt"
            )
        return error(
            f"{where} closed the connection during the ZMTP handshake {n} time(s): it "
            f"requires CURVE encryption, most likely ({_CURVE_HINT})"
        )

    # -- sending -----------------------------------------------------------------------

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if enc.nbytes < _COPY_BYTES:  # one frame, copied by libzmq: no trackers to wait on
            frame = b"".join([START, *enc.frames()])
            turns = self._owning
            if not turns.lock.acquire(False):
                turns.wait_turn()
            try:
                while True:
                    if self._closed or self._lost or self._refusal is not None:
                        self._check_usable()
                    try:
                        self._dealer.send(frame, _SEND_LAST)
                        return
                    except zmq.Again:  # not connected, or its queue is full
                        self._wait_writable(deadline)
            finally:
                turns.lock.release()
        trackers: list[zmq.MessageTracker] = []
        # The sockets stay ours until the last piece is queued: another sender's pieces
        # must not come between them.
        with self._owning:
            self._check_usable()
            for piece in _pieces(enc):
                while not _queue_piece(self._dealer, piece, trackers):
                    self._wait_writable(deadline)
        _wait_released(trackers, deadline, "the hub")

    def _wait_writable(self, deadline: float | None) -> None:
        """Wait until the DEALER takes a message: connected, and its queue not full."""
        # ZMQ_FD signals any change of the events (edge-triggered): wait on it only after
        # ZMQ_EVENTS said "not writable", and ask again after every wake-up.
        while not cast(int, self._dealer.get(_EVENTS)) & _POLLOUT:
            self._check_usable()
            left = remaining(deadline)
            if left == 0.0:
                raise TransportTimeout(
                    f"the hub at {self.url} took no message within the timeout (not connected, "
                    f"or its queue of {QUEUE_PIECES} pieces stayed full)"
                )
            for fd, _ in self._poll_out.poll(_poll_ms(left)):
                if fd == self._monitor_fd:
                    self._read_monitor()

    # -- receiving ---------------------------------------------------------------------

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        while True:
            msg: Message | WireError | None
            if self._pending:
                msg = self._pending.popleft()
            else:
                events = self._reader.feed(self._next_frames(deadline), out)
                msg = events[0] if len(events) == 1 else self._first_of(events)
                if msg is None:
                    continue
            if isinstance(msg, WireError):
                raise msg
            session = self._session
            if msg.kind == "data" and session.state is State.OPEN:  # receive's Data, unmade
                return msg
            event = session.receive(msg)
            if isinstance(event, Data):
                return msg
            if isinstance(event, Closed):
                self._drop()
                raise session.closed_error()
            log.debug("zmq: from the hub at %s: %s", self.url, event)

    def _first_of(self, events: list[Message | WireError]) -> Message | WireError | None:
        """The first of ``events`` (the others wait in ``_pending``); None if there are none."""
        self._pending.extend(events)
        return self._pending.popleft() if self._pending else None

    def _next_message(self, deadline: float | None, out: Any) -> Message:
        """The next message of any kind; its WireError if it was malformed."""
        while not self._pending:
            self._pending.extend(self._reader.feed(self._next_frames(deadline), out))
        event = self._pending.popleft()
        if isinstance(event, WireError):
            raise event
        return event

    def _next_frames(self, deadline: float | None) -> list[zmq.Frame]:
        """The frames of the DEALER's next ZeroMQ message, waiting for it until ``deadline``."""
        turns = self._owning
        if not turns.lock.acquire(False):
            turns.wait_turn()
        try:
            dealer = self._dealer
            while True:
                if self._closed or self._lost or self._refusal is not None:
                    self._check_usable()
                if dealer.get(_EVENTS) & _POLLIN:  # type: ignore[operator]  # _readable
                    return _recv_frames(dealer)
                if deadline is None:
                    ms = None
                else:  # _poll_ms(remaining(deadline))
                    left = deadline - time.monotonic()
                    if left <= 0.0:
                        raise TransportTimeout(f"no message from the hub at {self.url} in time")
                    ms = int(left * 1000) + 1
                for fd, _ in self._poll_in.poll(ms):
                    if fd == self._monitor_fd:
                        self._read_monitor()  # lost: what arrived before is still read first
                    elif fd == self._wake_fd:
                        self._step_aside()
        finally:
            turns.lock.release()

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
        with self._owning:
            if not self._closed:
                self._teardown(0.0)

    def close(self) -> None:
        """Say goodbye to the hub and close the connection."""
        with self._owning:
            if self._closed:
                return
            linger = 0.0
            if not self._lost:
                with contextlib.suppress(zmq.ZMQError):
                    if _queue_piece(self._dealer, next(_pieces(bye())), []):
                        linger = BYE_TIMEOUT
            self._teardown(linger)
