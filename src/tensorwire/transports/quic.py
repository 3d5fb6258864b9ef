"""``quic://host:port``: QUIC (RFC 9000, with ``aioquic``), one stream per message.

QUIC brings TLS 1.3, its own loss recovery and congestion control, and streams that do not
block each other: a message lost in part holds up only its own stream's bytes. Each message
travels on a fresh unidirectional stream (so no stream ever nears the 2^62 offset limit, and a
send that times out resets its stream and leaves the connection usable); the receiver delivers
whole messages in the order their streams were opened, which is the order they were sent.

The session (``docs/session.md``) maps onto streams directly: the client's first stream carries
its ``hello``, the hub answers ``welcome`` (or ``refuse``) on its first stream, and so on.
Without credentials the hub still encrypts, with a throwaway self-signed certificate the
client does not check (anyone may join, as on every scheme without credentials). With
``tls=`` the client checks the hub's certificate; with a CA on the hub, every client must
present a certificate that CA signed whose common name is its client id (mutual TLS, as
``tcp`` ``tls=`` does).

All of a hub's connections share one UDP socket and one I/O thread; a channel has its own.
That thread runs ``aioquic``'s sans-IO connection: it reads every datagram that is waiting,
feeds them in, then sends what the connection has to send, and wakes for the connection's
timers (loss detection, acknowledgements, pacing) with sub-millisecond precision.
``docs/transports/quic.md`` has the options and the numbers.

aioquic's public API lacks a few things this module needs, so it reaches into internals of
aioquic 1.7 (the extra pins it below 2; the tests fail if any stops working): asking for a
client certificate (``tls._request_client_certificate``), the ``max_ack_delay`` it announces,
the loss recovery's counters, pacer and least window (``_loss``), how much of a stream is
not yet acknowledged (``_streams``), an early look at a close by the peer (``_close_event``)
and the connection ids to route datagrams by (``_host_cids``).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from aioquic.buffer import Buffer
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import (
    QuicPacketType,
    pull_quic_header,
    pull_quic_transport_parameters,
    push_quic_transport_parameters,
)
from aioquic.tls import verify_certificate
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

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
    _log_limited,
    deadline_after,
    default_client_id,
    dial,
    remaining,
)
from tensorwire.transports.security import TLS
from tensorwire.transports.session import (
    HELLO_LIMITS,
    Closed,
    Data,
    HubSession,
    Joined,
    Welcomed,
    bye,
)
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import PREFIX_SIZE, EncodedMessage, Limits, Message, MessageStream
from tensorwire.wire.format import parse_prefix

log = logging.getLogger("tensorwire.transports.quic")

ALPN = "tensorwire"
OPTIONS = ("mtu", "cc", "idle")
DEFAULT_MTU = 1350
"""UDP payload bytes per datagram: fits a 1500-byte path with room for tunnels (QUIC's floor
is 1200). At most :data:`MAX_MTU`."""
MAX_MTU = 16000
"""aioquic writes a STREAM frame's length as a 2-byte varint (at most 16,383): a larger
datagram would carry frames it cannot describe, and the peer fails to parse them."""
DEFAULT_CC = "cubic"
IDLE_TIMEOUT = 20.0
"""Seconds without a packet from the peer after which its connection is dropped; each side
pings after a third of it, so a live but quiet peer is never dropped."""
MAX_DATA = 64 << 20
"""Flow control: bytes a peer may have in flight to us per connection (and per stream)."""
SEND_AHEAD = 8 << 20
"""Bytes of one message handed to the QUIC connection ahead of the peer's acknowledgements."""
PIECE = 1 << 20
"""Most bytes handed to the connection in one call."""
HANDSHAKE_TIMEOUT = 10.0
MAX_HANDSHAKES = 64
"""Connections at once that have not said hello; more are ignored until some have."""
MAX_HELD = 1024
"""Messages one connection may have complete but waiting behind an earlier stream."""
BYE_TIMEOUT = 1.0
FLUSH_TIMEOUT = 5.0
"""Seconds ``close`` waits for what it sent to be acknowledged before closing anyway."""
PACING_BURST_S = 0.002
"""The longest burst pacing lets go at once, in seconds of the pacing rate: the I/O thread
wakes about every millisecond at best, so a shorter one would cap the rate."""
ACK_DELAY_MS = 5
"""The ``max_ack_delay`` announced to the peer, ms (aioquic's own: 25; see
:class:`_Connection`). At 4g with 10 % loss: 5.9 s instead of 8.9 s per 2 x 2.3 MB."""
MIN_WINDOW_PACKETS = 10
"""The least congestion window, in datagrams, a loss can shrink it to (RFC 9002 and aioquic:
2; 10 is QUIC's initial window). With 2, random loss (a radio link's, not congestion) leaves
too few packets in flight for loss to be seen by later acknowledgements: each loss waits
for a probe timeout. At 4g with 10 % loss: 3.0 s instead of 5.9 s (tcp: 4.4 s)."""
RECV_BATCH = 256  # datagrams read per wake-up before sending what they call for
SOCKET_BUFFER = 8 << 20
APP_CLOSED = 0  # application error codes in CONNECTION_CLOSE
APP_REPLACED = 1
APP_REFUSED = 2
APP_CANCELLED = 3  # RESET_STREAM: a send gave up on its deadline
_CRYPTO_ERROR = 0x100  # + the TLS alert
_CERT_ALERTS = {42, 43, 44, 45, 46, 48, 49, 116}


def _options(url: str) -> tuple[int, str, float]:
    query = query_options(url, OPTIONS)
    try:
        mtu = int(query.get("mtu", DEFAULT_MTU))
        idle = float(query.get("idle", IDLE_TIMEOUT))
    except ValueError:
        raise TransportError(f"{url!r}: mtu= is whole bytes, idle= seconds") from None
    if not 1200 <= mtu <= MAX_MTU:
        raise TransportError(f"{url!r}: mtu={mtu}: 1200 (QUIC's least) to {MAX_MTU} bytes")
    cc = query.get("cc", DEFAULT_CC)
    if cc not in ("cubic", "reno"):
        raise TransportError(f"{url!r}: cc={cc}: aioquic offers cubic and reno")
    if not 1.0 <= idle <= 600.0:
        raise TransportError(f"{url!r}: idle={idle}: 1 to 600 seconds")
    return mtu, cc, idle


def _configuration(is_client: bool, mtu: int, cc: str, idle: float) -> QuicConfiguration:
    return QuicConfiguration(
        is_client=is_client,
        alpn_protocols=[ALPN],
        congestion_control_algorithm=cc,
        idle_timeout=idle,
        max_datagram_size=mtu,
        max_data=MAX_DATA,
        max_stream_data=MAX_DATA,
    )


def _self_signed() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A throwaway certificate: a hub without credentials still encrypts."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tensorwire-hub")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _common_name(cert: x509.Certificate) -> str | None:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else None


class _Connection(QuicConnection):
    """aioquic's connection, telling the peer how soon it really acknowledges.

    aioquic acknowledges within 1 ms (its ``K_GRANULARITY``; this module's I/O thread adds at
    most about a millisecond), yet announces the RFC's default ``max_ack_delay`` of 25 ms,
    which the peer adds to every probe timeout: on a lossy link of a few ms RTT that makes
    each tail loss cost 25 ms and more (the timeout doubles with each probe)."""

    def _serialize_transport_parameters(self) -> bytes:
        params = pull_quic_transport_parameters(
            Buffer(data=super()._serialize_transport_parameters())
        )
        params.max_ack_delay = ACK_DELAY_MS
        buf = Buffer(capacity=3 * self._max_datagram_size)
        push_quic_transport_parameters(buf, params)
        return buf.data


class _ServerConnection(_Connection):
    """A hub's connection that asks the client for its certificate (mutual TLS).

    aioquic's TLS layer can request a client certificate (it then checks that the client owns
    the key) but exposes the switch only as an attribute; the chain is checked against the
    hub's CA by :meth:`QuicHub._check_certificate` once the handshake is done."""

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        self.tls._request_client_certificate = True


# --- one connection: streams in, streams out --------------------------------------------------


@dataclass(eq=False)
class _Rx:
    """A message arriving on one stream: its bytes as they came, checked against the limits."""

    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    total: int | None = None  # what its prefix declares, once known


@dataclass(eq=False)
class _SendJob:
    pieces: Iterator[memoryview | bytes]
    nbytes: int
    stream_id: int = -1
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None
    written: bool = False  # every byte and the FIN are with the connection


def _pieces(enc: EncodedMessage) -> Iterator[memoryview | bytes]:
    for batch in enc.segments():
        for buf in batch:
            view = memoryview(buf).cast("B")
            for start in range(0, len(view), PIECE):
                yield view[start : start + PIECE]


Deliver = Callable[["_Link", "list[bytes] | WireError | None"], None]


class _Link:
    """One QUIC connection and the messages on it (used by the I/O thread only).

    ``deliver(link, item)`` gets each peer stream's message in stream order: its raw bytes (a
    list of chunks), a :class:`WireError` (it broke the limits or was cut short), or None (the
    sender reset it: a send that gave up)."""

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
        self._rx: dict[int, _Rx] = {}
        self._ready: dict[int, list[bytes] | WireError | None] = {}
        self._dead: set[int] = set()  # peer streams given up on: their late data is dropped
        self.jobs: deque[_SendJob] = deque()
        self.unacked: set[int] = set()  # our streams the peer has not acknowledged in full
        self.handshake_done = threading.Event()
        self.closed = threading.Event()
        self.close_reason = ""
        self.close_error: TransportError | None = None
        self.created = time.monotonic()
        self.last_ping = time.monotonic()
        self.close_later: tuple[int, str, float] | None = None  # code, reason, by when
        self.pto_count = 0
        self.lost_packets = 0
        self.sent_packets = 0
        self._count_losses()

    @property
    def stats(self) -> dict[str, int]:
        return {
            "sent_packets": self.sent_packets,
            "lost_packets": self.lost_packets,
            "pto": self.pto_count,
        }

    def log_stats(self, who: str) -> None:
        log.info(
            "quic: %s: %d packets sent, %d lost, %d probe timeouts",
            who,
            self.sent_packets,
            self.lost_packets,
            self.pto_count,
        )

    def _count_losses(self) -> None:
        """Count packets sent, packets lost and probe timeouts (aioquic keeps no totals)."""
        loss = self.conn._loss
        on_timeout, on_lost = loss.on_loss_detection_timeout, loss._on_packets_lost

        def timeout_counted(*args: Any, **kwargs: Any) -> Any:
            before = loss._pto_count
            result = on_timeout(*args, **kwargs)
            self.pto_count += loss._pto_count > before
            return result

        def lost_counted(*args: Any, **kwargs: Any) -> Any:
            packets = kwargs.get("packets", ())
            if kwargs.get("congestion_event", True):  # not a probe's early retransmission
                packets = list(packets)
                kwargs["packets"] = packets
                self.lost_packets += len(packets)
            return on_lost(*args, **kwargs)

        on_sent = loss.on_packet_sent

        def sent_counted(*args: Any, **kwargs: Any) -> None:
            self.sent_packets += 1
            on_sent(*args, **kwargs)

        loss.on_loss_detection_timeout = timeout_counted  # type: ignore[method-assign]
        loss._on_packets_lost = lost_counted  # type: ignore[method-assign]
        loss.on_packet_sent = sent_counted  # type: ignore[method-assign]

        # Pacing: aioquic lets a burst of at most 16 datagrams go before the next gap, which
        # a thread that wakes every millisecond at best turns into a rate cap (16 x 1350 B
        # per ms: 22 MB/s, whatever the window). Let a burst span PACING_BURST_S instead.
        pacer = loss._pacer
        update_rate = pacer.update_rate

        def burstier(*args: Any, **kwargs: Any) -> None:
            update_rate(*args, **kwargs)
            pacer.bucket_max = max(pacer.bucket_max, PACING_BURST_S)

        pacer.update_rate = burstier  # type: ignore[method-assign]

        cc = loss._cc
        floor = MIN_WINDOW_PACKETS * self.conn._max_datagram_size
        on_cc_lost, on_collapse = cc.on_packets_lost, cc.on_persistent_congestion

        def floored_lost(*args: Any, **kwargs: Any) -> None:
            on_cc_lost(*args, **kwargs)
            cc.congestion_window = max(cc.congestion_window, floor)

        def floored_collapse() -> None:
            on_collapse()
            cc.congestion_window = max(cc.congestion_window, floor)

        cc.on_packets_lost = floored_lost  # type: ignore[method-assign]
        cc.on_persistent_congestion = floored_collapse  # type: ignore[method-assign]

    # -- events from the connection --------------------------------------------------

    def handle(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            self._on_data(event.stream_id, event.data, event.end_stream)
        elif isinstance(event, events.StreamReset):
            self._give_up(event.stream_id, None)
        elif isinstance(event, events.HandshakeCompleted):
            self.handshake_done.set()
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
        self.closed.set()
        self.handshake_done.set()

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
        rx = self._rx.get(sid)
        if rx is None:
            rx = self._rx[sid] = _Rx()
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
            del self._rx[sid]
            self._complete(sid, rx.chunks)

    def _give_up(self, sid: int, item: WireError | None) -> None:
        if not self._peer_stream(sid) or sid < self.next_sid or sid in self._ready:
            return
        self._rx.pop(sid, None)
        self._dead.add(sid)
        self._complete(sid, item)

    def _complete(self, sid: int, item: list[bytes] | WireError | None) -> None:
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

    def submit(self, job: _SendJob) -> None:
        if self.closed.is_set():
            job.error = self.close_error or PeerGone("the connection is closed")
            job.done.set()
            return
        job.stream_id = self.conn.get_next_available_stream_id(is_unidirectional=True)
        self.conn.send_stream_data(job.stream_id, b"", end_stream=False)  # opens it: the order
        self.unacked.add(job.stream_id)
        self.jobs.append(job)
        self.pump()

    def cancel(self, job: _SendJob) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
            self._cancel_stream(job.stream_id)

    def _cancel_stream(self, sid: int) -> None:
        for job in list(self.jobs):
            if job.stream_id == sid:
                self.jobs.remove(job)
                job.error = PeerGone("the peer stopped reading the message")
                job.done.set()
        if sid in self.unacked:
            self.unacked.discard(sid)
            with contextlib.suppress(Exception):
                self.conn.reset_stream(sid, APP_CANCELLED)

    def pump(self) -> None:
        """Hand queued messages to the connection, up to :data:`SEND_AHEAD` unacknowledged
        bytes per stream."""
        for job in list(self.jobs):
            sender = self.conn._streams[job.stream_id].sender
            while sender._buffer_stop - sender._buffer_start < SEND_AHEAD:
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
            stream = self.conn._streams.get(sid)
            if stream is None or stream.sender.is_finished:
                self.unacked.discard(sid)

    @property
    def flushed(self) -> bool:
        """Whether everything sent so far has been acknowledged (or cannot be)."""
        return self.closed.is_set() or (not self.jobs and not self.unacked)

    def close(self, code: int, reason: str) -> None:
        if not self.closed.is_set():
            self.conn.close(error_code=code, reason_phrase=reason)
            self.close_reason = reason
            self.close_error = PeerGone(f"the connection was closed: {reason}")
            self._fail_jobs(self.close_error)
            self.closed.set()
            self.handshake_done.set()


# --- the I/O thread ------------------------------------------------------------------------------


class _Engine:
    """A UDP socket and the thread that runs its QUIC connections (all aioquic calls happen
    on it). A hub's engine accepts new connections (``accept``); a channel's has one."""

    def __init__(self, sock: socket.socket, name: str, accept: Any = None) -> None:
        self.sock = sock
        self.name = name
        self.accept = accept  # (datagram, header, addr, now) -> _Link | None
        self.links: dict[bytes, _Link] = {}  # by every connection id of ours
        self.tick: Callable[[float], None] | None = None  # per-turn housekeeping
        self._calls: deque[Callable[[], None]] = deque()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._wake_r, self._wake_w, sock):
            s.setblocking(False)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._selector.register(sock, selectors.EVENT_READ, "sock")
        self._stopping = False
        self._refused = False  # the kernel said nobody listens at the peer's port
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread (now, if this is it)."""
        if self.in_loop:
            fn()
            return
        self._calls.append(fn)
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    def add(self, link: _Link) -> None:
        for cid in self._cids(link):
            self.links[cid] = link

    @staticmethod
    def _cids(link: _Link) -> list[bytes]:
        return [c.cid for c in link.conn._host_cids]

    def remove(self, link: _Link) -> None:
        for cid, other in list(self.links.items()):
            if other is link:
                del self.links[cid]

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if self._thread.is_alive() and not self.in_loop:
            self._thread.join(timeout)

    # -- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                try:
                    self._turn()
                except Exception as exc:  # never let one failure stop every peer's I/O
                    _log_limited(f"quic {self.name}", f"quic: {self.name}: {exc!r}")
                    log.debug("quic: %s failed", self.name, exc_info=True)
                    time.sleep(0.05)
        finally:
            for _ in range(len(self._calls)):  # last words: a CONNECTION_CLOSE, say
                with contextlib.suppress(Exception):
                    self._calls.popleft()()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()
            self.sock.close()

    def _turn(self) -> None:
        while self._calls:
            self._calls.popleft()()
        now = time.monotonic()
        links = set(self.links.values())
        for link in links:
            timer = link.conn.get_timer()
            if timer is not None and timer <= now:
                link.conn.handle_timer(now)
            self._events(link)
        if self.tick is not None:
            self.tick(now)
        self._transmit(set(self.links.values()), now)
        wait = self._next_wake(now)  # epoll rounds it up to whole milliseconds
        for key, _ in self._selector.select(wait):
            if key.data == "wake":
                with contextlib.suppress(BlockingIOError):
                    self._wake_r.recv(4096)
            else:
                self._receive()

    def _next_wake(self, now: float) -> float | None:
        timers = [t for link in self.links.values() if (t := link.conn.get_timer()) is not None]
        wait = max(min(timers) - now, 0.0) if timers else None
        if self.tick is not None:
            wait = 0.25 if wait is None else min(wait, 0.25)
        return wait

    def _receive(self) -> None:
        now = time.monotonic()
        touched: set[_Link] = set()
        for _ in range(RECV_BATCH):
            try:
                data, addr = self.sock.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:  # ICMP: nobody listens at the peer's port
                self._refused = True
                continue
            except OSError:
                break
            link = self._route(data, addr, now)
            if link is None:
                continue
            link.conn.receive_datagram(data, addr, now=now)
            touched.add(link)
        for link in touched:
            self._events(link)
        self._transmit(touched, now)

    def _route(self, data: bytes, addr: Any, now: float) -> _Link | None:
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=8)
        except ValueError:
            return None  # not QUIC: dropped, as QUIC requires
        link = self.links.get(header.destination_cid)
        new = header.packet_type == QuicPacketType.INITIAL and len(data) >= 1200
        if link is None and self.accept is not None and new:
            link = self.accept(header, addr, now)
            if link is not None:
                self.links[header.destination_cid] = link
                self.add(link)
        return link

    def _events(self, link: _Link) -> None:
        conn = link.conn
        for _ in range(100_000):
            event = conn.next_event()
            if event is None:
                break
            if isinstance(event, events.ConnectionIdIssued):
                self.links[event.connection_id] = link
            elif isinstance(event, events.ConnectionIdRetired):
                self.links.pop(event.connection_id, None)
            link.handle(event)
        close = conn._close_event  # the peer closed: aioquic says so only after draining
        if close is not None and not link.closed.is_set():
            link.handle(close)
        link.pump()

    def _transmit(self, links: set[_Link], now: float) -> None:
        for link in links:
            try:
                datagrams = link.conn.datagrams_to_send(now=now)
            except Exception as exc:  # a bug for one connection: close it, serve the rest
                log.debug("quic: %s: cannot build packets", self.name, exc_info=True)
                link.close(APP_REFUSED, f"internal error: {exc!r}")
                continue
            for data, addr in datagrams:
                try:
                    self.sock.sendto(data, addr)
                except (BlockingIOError, InterruptedError):
                    break  # the socket buffer is full: as if lost; QUIC recovers
                except ConnectionRefusedError:
                    self._refused = True
                except OSError as exc:
                    _log_limited(f"quic send {self.name}", f"quic: {self.name}: send: {exc}")
            if link.closed.is_set() and link.conn._state.name in ("TERMINATED",):
                self.remove(link)

    # -- called from other threads -------------------------------------------------------

    def run_send(self, link: _Link, enc: EncodedMessage, deadline: float | None) -> None:
        """Send one message on ``link`` by ``deadline``: TransportTimeout (the stream is
        reset, the connection stays) or PeerGone."""
        job = _SendJob(_pieces(enc), len(enc))
        if self.in_loop:  # a callback of ours sends: queue it, never wait on ourselves
            link.submit(job)
            if job.error is not None:
                raise job.error
            return
        self.call(lambda: link.submit(job))
        if not job.done.wait(remaining(deadline)):
            self.call(lambda: link.cancel(job))
            raise TransportTimeout(f"send of {job.nbytes} bytes timed out")
        if job.error is not None:
            raise job.error

    def flush(self, links: list[_Link], timeout: float) -> None:
        """Wait until what was sent on ``links`` is acknowledged, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping:
            if all(link.flushed for link in links):
                return
            time.sleep(0.005)


# --- the hub ---------------------------------------------------------------------------------


class QuicHub(Hub):
    """Hub listening on ``quic://host:port`` (UDP; port 0 picks a free one; see :attr:`url`)."""

    protocol = "quic"

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(**options)
        mtu, cc, idle = _options(url)
        host, port = host_port(url, default_port=0)
        config = _configuration(False, mtu, cc, idle)
        if self.tls is None:
            config.certificate, config.private_key = _self_signed()
        else:
            if self.tls.cert is None or self.tls.key is None:
                raise TransportError(
                    "a hub's TLS needs cert= and key= (tensorwire certs makes them)"
                )
            config.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        self._config = config
        self._mutual = self.tls is not None and self.tls.mutual
        self._idle = idle
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.bind((host, port))
        query = "" if "?" not in url else "?" + url.split("?", 1)[1]
        self.url = f"quic://{host}:{sock.getsockname()[1]}{query}"
        self._peers: dict[str, _Link] = {}
        self._sessions: dict[_Link, HubSession] = {}
        self._lock = threading.Lock()
        self._engine = _Engine(sock, f"tensorwire-quic-hub-{sock.getsockname()[1]}", self._accept)
        self._engine.tick = self._tick

    def _accept(self, header: Any, addr: Any, now: float) -> _Link | None:
        waiting = sum(1 for s in self._sessions.values() if s.client_id is None)
        if waiting >= MAX_HANDSHAKES:
            _log_limited("quic handshakes", "quic: too many connections without a hello")
            return None
        cls = _ServerConnection if self._mutual else _Connection
        conn = cls(
            configuration=self._config, original_destination_connection_id=header.destination_cid
        )
        link = _Link(conn, addr, client_side=False, limits=HELLO_LIMITS, deliver=self._deliver)
        self._sessions[link] = HubSession(**self._session_options())
        return link

    def _tick(self, now: float) -> None:
        """Housekeeping on the I/O thread: connections that never said hello, keep-alives,
        connections that ended."""
        for link in list(self._sessions):
            session = self._sessions[link]
            if link.closed.is_set():
                self._ended(link, session)
            elif link.close_later is not None:
                code, reason, until = link.close_later
                if link.flushed or now > until:
                    link.close(code, reason)
            elif session.client_id is None and now - link.created > HANDSHAKE_TIMEOUT:
                self._refused(f"{link.addr[0]}:{link.addr[1]}", TransportError("no hello in time"))
                link.close(APP_REFUSED, "no hello in time")
            elif now - link.last_ping > self._idle / 3:
                link.last_ping = now
                link.conn.send_ping(0)

    def _ended(self, link: _Link, session: HubSession) -> None:
        del self._sessions[link]
        cid = session.client_id
        if cid is None:
            return
        link.log_stats(f"connection of {cid!r} ended")
        with self._lock:
            current = self._peers.get(cid) is link
            if current:
                del self._peers[cid]
        if current:
            self._left(cid, link.close_reason or "connection lost", session=link)

    def _check_certificate(self, link: _Link) -> str | None:
        """The verified common name of the client's certificate (mutual TLS), else None;
        AuthenticationError for a certificate the hub's CA did not sign."""
        if not self._mutual:
            return None
        assert self.tls is not None and self.tls.ca is not None
        tls = link.conn.tls
        cert = getattr(tls, "_peer_certificate", None)
        if cert is None:
            raise AuthenticationError("the client presented no certificate (mutual TLS)")
        try:
            verify_certificate(
                certificate=cert,
                chain=list(getattr(tls, "_peer_certificate_chain", [])),
                cafile=str(self.tls.ca),
            )
        except Exception as exc:
            raise AuthenticationError(f"the client's certificate does not verify: {exc}") from None
        name = _common_name(cert)
        if name is None:
            raise AuthenticationError("the client's certificate carries no name")
        return name

    def _decode(self, chunks: list[bytes], limits: Limits) -> Message:
        stream = MessageStream(limits=limits, codec_lookup=get_codec)
        for chunk in chunks:
            stream.receive_data(chunk)
        event = stream.next_event()
        if not isinstance(event, Message):
            raise WireError("a stream ended inside its message")
        return event

    def _deliver(self, link: _Link, item: list[bytes] | WireError | None) -> None:
        session = self._sessions.get(link)
        if session is None or link.closed.is_set():
            return
        cid = session.client_id
        who = f"{link.addr[0]}:{link.addr[1]}"
        if item is None:
            if cid is None:
                self._refused(who, TransportError("the hello was withdrawn"))
                link.close(APP_REFUSED, "the hello was withdrawn")
            return
        try:
            if isinstance(item, WireError):
                raise item
            msg = self._decode(item, link.limits)
        except WireError as exc:
            if cid is None:
                self._refused(who, exc)
                link.close(APP_REFUSED, "the first message was not a hello")
            else:
                self._rejected(cid, exc)
            return
        if cid is None:
            self._hello(link, session, msg)
            return
        event = session.receive(msg)
        if isinstance(event, Data):
            self._delivered(cid, msg)
        elif isinstance(event, Closed):
            link.close(APP_CLOSED, event.reason or "said goodbye")
            link.close_reason = event.reason or "said goodbye"
            self._ended(link, session)
        else:
            log.debug("quic: %r: %s", cid, event)

    def _send_now(self, link: _Link, enc: EncodedMessage) -> None:
        job = _SendJob(_pieces(enc), len(enc))
        link.submit(job)

    def _hello(self, link: _Link, session: HubSession, msg: Message) -> None:
        who = f"{link.addr[0]}:{link.addr[1]}"
        try:
            session = self._sessions[link] = HubSession(
                **self._session_options(), tls_name=self._check_certificate(link)
            )
            event = session.receive(msg)
        except SessionRefused as exc:
            self._send_now(link, session.refusal(exc))
            self._refused(who, exc)
            self._close_after_flush(link, APP_REFUSED, str(exc))
            return
        if not isinstance(event, Joined):
            log.debug("quic: %s: first message %s", who, event)
            return
        hello = session.hello
        assert hello is not None
        cid = hello.client_id
        link.limits = self.limits
        link.hello_only = False
        with self._lock:
            old = self._peers.get(cid)
            self._peers[cid] = link
        if old is not None and old is not link:
            log.info("quic: client %r reconnected from %s; closing its old connection", cid, who)
            old.close(APP_REPLACED, "replaced by a new connection of the same client")
            old_session = self._sessions.pop(old, None)
            del old_session
        replaced = self._make_member(
            cid, hello.decoders, session=link, max_message_bytes=hello.max_message_bytes
        )
        self._send_now(link, session.welcome())
        self._announce_member(cid, replaced)

    def _close_after_flush(self, link: _Link, code: int, reason: str) -> None:
        """Close once what was queued on ``link`` is acknowledged (a refusal must arrive),
        or after :data:`BYE_TIMEOUT`; :meth:`_tick` does it."""
        link.close_later = (code, reason, time.monotonic() + BYE_TIMEOUT)

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        with self._lock:
            link = self._peers.get(client_id)
        if link is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        self._engine.run_send(link, enc, deadline)

    def _close_transport(self) -> None:
        with self._lock:
            links = list(self._peers.values())
        goodbye = bye("the hub is closing")
        for link in links:
            self._engine.call(functools.partial(self._send_now, link, goodbye))
        self._engine.flush(links, BYE_TIMEOUT)
        done = threading.Event()

        def close_all() -> None:
            for link in list(self._sessions):
                link.close(APP_CLOSED, "the hub is closing")
            self._engine._transmit(set(self._sessions), time.monotonic())
            done.set()

        self._engine.call(close_all)
        done.wait(BYE_TIMEOUT)
        self._engine.stop()

    def quic_stats(self) -> dict[str, dict[str, int]]:
        """Per connected client: packets sent, packets declared lost and probe timeouts
        (aioquic's loss recovery) on its connection so far."""
        with self._lock:
            return {cid: link.stats for cid, link in self._peers.items()}


# --- the channel -----------------------------------------------------------------------------


class QuicChannel(Channel):
    """A client's QUIC connection to a :class:`QuicHub`; retries for ``timeout`` seconds."""

    protocol = "quic"

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
        self._mtu, self._cc, self._idle = _options(url)
        self._address = host_port(url)
        self._credentials(tls, key)
        self._closed = True
        self._engine: _Engine | None = None
        self.reconnect(timeout)

    def _config(self) -> QuicConfiguration:
        config = _configuration(True, self._mtu, self._cc, self._idle)
        if self.tls is None:
            config.verify_mode = ssl.CERT_NONE  # the hub's throwaway certificate
        else:
            config.server_name = self.tls.server_name or self._address[0]
            if self.tls.ca is not None:
                config.load_verify_locations(cafile=str(self.tls.ca))
            if self.tls.cert is not None:
                if self.tls.key is None:
                    raise TransportError("a client certificate needs its key= too")
                config.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        return config

    def _open(self, deadline: float | None) -> tuple[_Engine, _Link, Welcomed]:
        host, port = self._address
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        sock = socket.socket(info[0], socket.SOCK_DGRAM)
        sock.connect(info[4])
        addr = info[4]
        conn = _Connection(configuration=self._config())
        inbox: deque[list[bytes] | WireError | None] = deque()
        arrived = threading.Condition()

        def deliver(link: _Link, item: list[bytes] | WireError | None) -> None:
            with arrived:
                inbox.append(item)
                arrived.notify_all()

        link = _Link(conn, addr, client_side=True, limits=self.limits, deliver=deliver)
        engine = _Engine(sock, f"tensorwire-quic-{self.client_id}")
        self._inbox, self._arrived = inbox, arrived

        def start() -> None:
            conn.connect(addr, now=time.monotonic())
            engine.add(link)

        def tick(now: float) -> None:
            if engine._refused and not link.handshake_done.is_set():
                link.close(APP_CLOSED, "nobody listens there")
            if link.closed.is_set():
                with arrived:
                    arrived.notify_all()
            elif link.handshake_done.is_set() and now - link.last_ping > self._idle / 3:
                link.last_ping = now
                conn.send_ping(0)

        engine.tick = tick
        engine.call(start)
        try:
            left = remaining(deadline)
            attempt = HANDSHAKE_TIMEOUT if left is None else min(left, HANDSHAKE_TIMEOUT)
            if not link.handshake_done.wait(attempt) or link.closed.is_set():
                error = link.close_error
                if isinstance(error, AuthenticationError):
                    raise error
                raise PeerGone(
                    f"no QUIC handshake with {self.url}: {link.close_reason or 'no answer'}"
                )
            self._engine, self._link = engine, link
            session = self._client_session(f"the hub at {self.url}")
            engine.run_send(link, session.hello(), deadline)
            welcome = session.receive(self._next_raw(deadline, None))
        except BaseException:
            engine.call(lambda: link.close(APP_CLOSED, "connecting failed"))
            engine.call(lambda: engine._transmit({link}, time.monotonic()))
            engine.stop()
            raise
        assert isinstance(welcome, Welcomed)
        self._session = session
        return engine, link, welcome

    def _next_raw(self, deadline: float | None, out: Any) -> Message:
        """The next message from the hub, decoded here (into ``out`` where it fits)."""
        while True:
            with self._arrived:
                while not self._inbox:
                    if self._link.closed.is_set():
                        raise self._link.close_error or PeerGone("the connection is closed")
                    left = remaining(deadline)
                    if left is not None and left <= 0:
                        raise TransportTimeout("receive timed out")
                    self._arrived.wait(0.25 if left is None else min(left, 0.25))
                item = self._inbox.popleft()
            if item is None:
                continue  # the hub gave up on a send
            if isinstance(item, WireError):
                raise item
            stream = MessageStream(limits=self.limits, codec_lookup=get_codec)
            stream.set_out(out)
            for chunk in item:
                stream.receive_data(chunk)
            event = stream.next_event()
            if isinstance(event, Message):
                return event
            raise WireError("a stream ended inside its message")

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)dial the hub and say hello with the same client id."""
        if not self._closed:
            self._drop()
        engine, link, welcome = dial(self._open, what=self.url, timeout=timeout)
        self._engine, self._link = engine, link
        self.hub_decoders = welcome.decoders
        self.hub_max_bytes = welcome.max_message_bytes
        self._closed = False

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed or self._engine is None:
            raise PeerGone("channel is closed; call reconnect()")
        self._engine.run_send(self._link, enc, deadline)

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        while True:
            try:
                msg = self._next_raw(deadline, out)
            except WireError as exc:
                self._rejected(exc)
                continue
            except PeerGone:
                self._drop()
                raise
            event = self._session.receive(msg)
            if isinstance(event, Data):
                return msg
            if isinstance(event, Closed):
                self._drop()
                raise self._session.closed_error()

    def quic_stats(self) -> dict[str, int]:
        """Packets sent, packets declared lost and probe timeouts on this connection."""
        return self._link.stats

    def _drop(self, flush: float = 0.0) -> None:
        """Close the connection (after up to ``flush`` seconds for acknowledgements)."""
        self._closed = True
        engine, link = self._engine, self._link
        if engine is None:
            return
        if flush:
            engine.flush([link], flush)
        link.log_stats(f"{self.client_id}: connection closed")
        done = threading.Event()

        def close() -> None:
            link.close(APP_CLOSED, "the client is closing")
            engine._transmit({link}, time.monotonic())
            done.set()

        engine.call(close)
        done.wait(BYE_TIMEOUT)
        engine.stop()
        self._engine = None

    def close(self) -> None:
        """Say goodbye to the hub, wait for what was sent to be acknowledged, and close."""
        if self._closed:
            return
        with contextlib.suppress(TransportError):
            self._send_encoded(bye(), deadline_after(BYE_TIMEOUT))
        self._drop(flush=FLUSH_TIMEOUT)
