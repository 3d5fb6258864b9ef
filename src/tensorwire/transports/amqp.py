"""``amqp://user:pass@host:port/vhost?prefix=NAME&chunk=BYTES``: tensorwire over RabbitMQ (pika)
(``amqps://``, or ``tls=``: over TLS to the broker, port 5671 by default).

``docs/transports/amqp.md`` specifies the mapping. Names, all under the hub's ``prefix`` (from
the URL, else random; :attr:`AmqpHub.url` carries it), so hubs sharing a broker never meet:

- ``PREFIX.up``: the uplink, a durable queue the hub consumes exclusively and every client
  publishes its hello, data and bye to (through the default exchange);
- ``PREFIX.c.CLIENT.TAG``: a durable queue per client session (``TAG``: 8 random hex digits),
  declared and consumed by the client before its hello, so nothing the hub sends after the
  hello is lost; the hub sends its welcome, refuse, bye and unicast data to it by name;
- ``PREFIX.all``: a durable fanout exchange; the hub binds a client's queue to it when it
  accepts the hello, so a broadcast to all members is one publish.

Every AMQP message is one chunk (``tensorwire.wire.iter_chunks``) carrying at most ``chunk``
bytes of its message, persistent, ``mandatory`` and confirmed, with its sender's client id (the
hub's: ``hub``) in the ``tw-client`` header; a send returns once the broker has every chunk on
disk, and a chunk no queue takes raises ``PeerGone``. The session (``docs/session.md``) runs on
:class:`HubSession` and :class:`ClientSession`; the hello names the client's queue (``queue``),
the client's bye its session (``session``), so a stale or forged bye cannot end a session.

Hostile input: the hub reads a sender that has not completed its hello only as one chunk of at
most 64 KiB (a hello); a client takes only chunks headed ``tw-client: hub``, and session
messages only through its own queue, never through the fanout exchange anyone can publish to.
Everything else is dropped, logged at most once per 10 s per kind, and never reaches ``recv``.
A repeated message id (a chunk published again after a lost confirm, a delivery the broker
repeats after a reconnect) is delivered once.

Security: TLS protects each link to the broker, the broker's users admit the links, and the
session's hello proves the device's secret to the hub (a refusal names the session it refuses).
Any other user of the broker can still publish to these queues, so a session with a key seals
every body after the welcome with a MAC trailer (``security.seal``; one entry per member on a
broadcast, which stays one publish) that the receiver checks before it reassembles anything;
the broker's redelivery (``redelivered``, which no other user can set) of a body already taken
is a duplicate, any other repeat a replay. A client that asks again after a reconnect seals
its hello; if the hub no longer has its session (the hello's nonce is spent), it asks in a new
session, with a new hello.

Broker faults: each side reconnects by itself with backoff, re-declares what it uses and
publishes again every chunk whose confirm did not come; the durable queues keep what they
held. The hub keeps its members through an outage (events ``medium-lost`` / ``medium-back``);
a member counts as gone once its queue has had no consumer for :data:`LEAVE_GRACE` seconds
of the hub's connected time, and the hub as gone for a client once its uplink has had none for
:data:`HUB_GRACE` seconds. A client says hello again (same session) after each reconnect,
so a hub that lost track of it takes it back.

Other query parameters go to pika (``heartbeat``, ``socket_timeout``, ``stack_timeout``,
``blocked_connection_timeout``, ...; not ``ssl_options``: TLS is ``tls=``), and an unknown one
raises. Three have tensorwire defaults where the URL gives none,
sized for lossy links, on which TCP's retransmission backoff (its timer doubles per loss, up
to 120 s) silences a connection for a minute or more:

- ``heartbeat`` :data:`HEARTBEAT` s. Both sides send one every heartbeat / 2 s; pika drops a
  connection that received nothing in a window of heartbeat + 5 s (so after 185..370 s of
  silence), the broker one that sent it nothing for 2..3 x heartbeat (360..540 s). A
  heartbeat may thus arrive ~95 s late. RabbitMQ's 60 s allows ~35 s, and at 20 % loss one
  arrived ~58 s late (a 118 s silence with heartbeat 120 s).
- ``socket_timeout`` :data:`CONNECT_TIMEOUT` s for the TCP connect (SYN retries).
- ``stack_timeout`` :data:`HANDSHAKE_TIMEOUT` s for connect and AMQP handshake together.

An attempt to connect never runs past the caller's deadline; failed ones are retried until it.
The broker has timeouts of its own: RabbitMQ closes a connection it could not send to for
30 s (``tcp_listen_options.send_timeout``), which on a lossy link drops a client that is
receiving a big message, and allows 10 s for a handshake (``handshake_timeout``). The private
broker (:class:`tensorwire.transports.brokers.RabbitMQBroker`) raises both; raise them on a
broker of your own too.

Threads: pika connections are not thread-safe, so each endpoint has two. A consumer
connection belongs to one thread that consumes, answers session messages and does the
bookkeeping; a publisher connection is shared under a lock, so a big send never stalls
receiving and user threads publish without handing buffers to another thread.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import ssl
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika
import pika.exceptions as px
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from tensorwire.errors import (
    AuthenticationError,
    ChunkError,
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
    Inbox,
    _log_limited,
    deadline_after,
    default_client_id,
    dial,
    remaining,
)
from tensorwire.transports.security import TLS, ReplayWindow, Sealer, unseal
from tensorwire.transports.session import (
    CLIENT_ID,
    HELLO_LIMITS,
    Closed,
    Data,
    HubSession,
    Ignored,
    State,
    Welcomed,
    bye,
)
from tensorwire.transports.url import query_options, redacted
from tensorwire.wire import (
    CHUNK_HEADER_SIZE,
    PREFIX_SIZE,
    ChunkReassembler,
    EncodedMessage,
    Limits,
    Message,
    decode_message,
    encode_message,
    iter_chunks,
    new_message_id,
    parse_chunk,
)
from tensorwire.wire.format import parse_prefix

log = logging.getLogger("tensorwire.transports.amqp")

DEFAULT_TLS_PORT = 5671  # amqps://, or tls= without a port in the URL
BROKER_MAX_MESSAGE = 128 << 20  # bytes: RabbitMQ's default max_message_size
DEFAULT_CHUNK = 4 << 20  # bytes per AMQP message: 1..8 MiB tie on loopback, 32+ MiB are slower
MIN_CHUNK = 1 << 10  # bytes
CONTROL_CHUNK = HELLO_LIMITS.max_message_bytes  # bytes: session messages always go as one chunk
# Seconds a chunked message may go without a new chunk. Confirmed publishes lose no chunk, but
# at 20 % loss TCP backoff makes one 2.3 MB message take up to 207 s, so a 4 MiB chunk can take
# far more than 60 s. Longer than a silent connection lives (see HEARTBEAT): this only bounds
# the memory of a sender that vanished mid-message.
REASSEMBLY_TIMEOUT = 600.0
MAX_PENDING = 8  # messages one sender may have half-arrived (it sends one at a time)
MAX_SEEN = 1 << 14  # ids of one-chunk messages remembered to drop a repeat
PREFETCH = 16  # chunks a consumer may hold unacknowledged
QUEUE_EXPIRES_MS = 600_000  # a queue nobody consumed for this long is deleted by the broker
BYE_TIMEOUT = 2.0  # seconds spent saying goodbye (and cleaning up) before closing anyway
RECONNECT_TIMEOUT = 60.0  # seconds a send without a timeout waits for a lost broker
OUTAGE_LIMIT = 600.0  # seconds without the broker before a channel gives up, a hub's members go
LEAVE_GRACE = 10.0  # seconds a member's queue may go unconsumed (it is reconnecting) on the hub
HUB_GRACE = 30.0  # seconds the uplink may go unconsumed (the hub is reconnecting), for a client
HUB_CHECK = 2.0  # seconds between a client's looks at the uplink
HELLO_RETRY = 2.0  # seconds to wait for a welcome before saying hello again
TICK = 0.5  # seconds between the consumer thread's bookkeeping rounds at most
KEEPALIVE = 10.0  # seconds between services of an idle publisher connection (heartbeats)
HEARTBEAT = 180  # seconds: tolerates a heartbeat ~95 s late (see the module's docstring)
CONNECT_TIMEOUT = 30.0  # seconds for a TCP connect: SYN retries at 1, 3, 7, 15 s fit
HANDSHAKE_TIMEOUT = 60.0  # seconds for connect + AMQP handshake (pika's 15 s fails at 20 % loss)
HUB = "hub"  # the tw-client header of the hub's messages
# Bytes of the hub's sealed payloads a client holds before the welcome that brings the key to
# check them (data the hub sends from on_join may overtake the welcome: section 8 of the doc).
EARLY_BYTES = 64 << 20
_PIKA_DEFAULTS = {
    "heartbeat": HEARTBEAT,
    "socket_timeout": CONNECT_TIMEOUT,
    "stack_timeout": HANDSHAKE_TIMEOUT,
}
_READ_BYTES = 1 << 16  # see _widen_reads
_MAX_NAME = 255  # bytes: AMQP short strings (queue and exchange names)
_CLIENT_HEADER = "tw-client"
_OUR_QUERY = ("prefix", "chunk")
# pika's URL options, but ssl_options: TLS is tensorwire's tls= (or amqps://, ?tls=1&ca=...)
_PIKA_QUERY = tuple(
    sorted(
        name.removeprefix("_set_url_")
        for name in dir(pika.URLParameters)
        if name.startswith("_set_url_") and name != "_set_url_ssl_options"
    )
)
_QUEUE_ARGS = {"x-expires": QUEUE_EXPIRES_MS}
_PERSISTENT = 2  # AMQP delivery mode: the broker keeps the message on disk until consumed
_STRANGER = "(not joined)"  # the hub's name in its errors for a sender without a session
_HUB_SENDER = b"hub"  # the sender the hub's MACs name (docs/security.md)

# pika logs every failed connection attempt and lost connection at ERROR, with tracebacks; those
# are the broker outages this module rides out and reports itself.
for _name in (
    "pika.connection",
    "pika.adapters.base_connection",
    "pika.adapters.blocking_connection",
    "pika.adapters.utils.connection_workflow",
    "pika.adapters.utils.io_services_utils",
):
    logging.getLogger(_name).setLevel(logging.CRITICAL)


# -- URL and connections ----------------------------------------------------------------------


class AmqpAddress:
    """An ``amqp://`` or ``amqps://`` URL split into pika's connection parameters and
    tensorwire's options.

    ``prefix`` names the hub's queues and exchange (``None``: the hub picks one); ``chunk`` is
    the most bytes per AMQP message (``None``: :data:`DEFAULT_CHUNK`). :attr:`params` has
    tensorwire's ``heartbeat``, ``socket_timeout`` and ``stack_timeout`` unless the URL sets them.
    ``tls`` (or an ``amqps://`` URL, with the system's CAs) makes the link TLS: pika's
    ``SSLOptions`` with ``tls.client_context()``, checking the broker's certificate for
    ``tls.server_name`` or the URL's host, on port :data:`DEFAULT_TLS_PORT` unless the URL names
    one. An option that is neither tensorwire's nor pika's raises ``TransportError``.
    """

    def __init__(self, url: str, tls: TLS | None = None) -> None:
        parts = urlsplit(url)
        shown = redacted(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise TransportError(f"{shown!r} is not an amqp:// or amqps:// URL")
        query_options(shown, (*_OUR_QUERY, *_PIKA_QUERY))
        if tls is None and parts.scheme == "amqps":
            tls = TLS()
        self.tls = tls
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {k: v for k, v in query if k in _OUR_QUERY}
        self.base = urlunsplit(
            parts._replace(query=urlencode([q for q in query if q[0] not in ours]))
        )
        try:  # TLS is set below, from tls: pika's own would take the system's CAs only
            self.params = pika.URLParameters(
                urlunsplit(urlsplit(self.base)._replace(scheme="amqp"))
            )
        except ValueError as exc:
            raise TransportError(f"{shown!r}: {exc}") from None
        given = {k for k, _ in query}
        for name, value in _PIKA_DEFAULTS.items():
            if name not in given:
                setattr(self.params, name, value)
        if tls is not None:
            if parts.port is None:
                self.params.port = DEFAULT_TLS_PORT
            try:
                context = tls.client_context()
            except (OSError, ValueError) as exc:  # a missing or unreadable certificate file
                raise TransportError(f"the TLS settings for {shown!r}: {exc}") from None
            self.params.ssl_options = pika.SSLOptions(context, tls.server_name or self.params.host)
        self.prefix = ours.get("prefix") or None
        if self.prefix is not None and (
            self.prefix.startswith("amq.") or len(self.prefix.encode()) > _MAX_NAME - 64
        ):
            raise TransportError(
                f"prefix {self.prefix!r}: must not start with 'amq.' (reserved by AMQP) and must "
                f"be at most {_MAX_NAME - 64} bytes"
            )
        self.chunk = _parse_chunk(ours["chunk"]) if "chunk" in ours else None

    def url_with(self, prefix: str, chunk: int | None) -> str:
        """The URL again, with ``prefix`` (and ``chunk`` if set) for clients to connect to."""
        parts = urlsplit(self.base)
        query = [*parse_qsl(parts.query, keep_blank_values=True), ("prefix", prefix)]
        if chunk is not None:
            query.append(("chunk", str(chunk)))
        return urlunsplit(parts._replace(query=urlencode(query)))

    @property
    def where(self) -> str:
        over = " over TLS" if self.tls is not None else ""
        return f"{self.params.host}:{self.params.port} (vhost {self.params.virtual_host!r}){over}"


def _parse_chunk(text: str | int) -> int:
    try:
        chunk = int(text)
    except ValueError:
        raise TransportError(f"chunk={text!r}: give the most bytes per AMQP message") from None
    most = BROKER_MAX_MESSAGE - CHUNK_HEADER_SIZE  # a body is the chunk and its header
    if not MIN_CHUNK <= chunk <= most:
        raise TransportError(
            f"chunk={chunk}: must be {MIN_CHUNK}..{most} bytes (and the body, 40 bytes more, "
            "under the broker's max_message_size)"
        )
    return chunk


def _widen_reads(conn: pika.BlockingConnection) -> None:
    """Read the socket 64 KiB at a time instead of pika's 4 KiB.

    pika appends every read to its frame buffer and re-slices it per frame: with 4 KiB reads a
    72 MB message takes ~310 ms to arrive on loopback, with 64 KiB ~120 ms (larger reads make
    the re-slicing cost more again). The attribute is private to pika: left alone if absent.
    """
    transport = getattr(getattr(conn, "_impl", None), "_transport", None)
    if transport is not None and hasattr(transport, "_MAX_RECV_BYTES"):
        transport._MAX_RECV_BYTES = _READ_BYTES


def _connect_once(
    address: AmqpAddress, deadline: float | None, name: str
) -> pika.BlockingConnection:
    """One attempt at a pika connection, within ``deadline`` (but 1 s at least).

    A refused credential or vhost is final (``SessionRefused``); anything else that keeps the
    broker from answering is a ``TransportError``, for :func:`dial` to retry.
    """
    params = copy.copy(address.params)
    params.client_properties = {"connection_name": name, "product": "tensorwire"}
    left = remaining(deadline)
    if left is not None:
        left = max(left, 1.0)
        params.socket_timeout = min(address.params.socket_timeout or left, left)
        params.stack_timeout = min(address.params.stack_timeout or left, left)
    try:
        conn = pika.BlockingConnection(params)
    except ssl.SSLCertVerificationError as exc:  # final: retrying will not change it
        raise AuthenticationError(
            f"RabbitMQ at {address.where} has a certificate this side does not trust "
            f"({exc.verify_message}): give tls=TLS(ca=...) the CA that signed it, and "
            "servername= the name it carries if that is not the URL's host"
        ) from None
    except (px.ProbableAuthenticationError, px.AuthenticationError) as exc:
        raise AuthenticationError(
            f"RabbitMQ at {address.where} refused the credentials in the URL: {exc!r}"
        ) from None
    except px.ProbableAccessDeniedError as exc:
        raise SessionRefused(
            f"RabbitMQ at {address.where}: no access to the vhost: {exc!r}"
        ) from None
    # AMQPConnectorException: pika's stack_timeout during the handshake, not an AMQPError.
    except (px.AMQPError, AMQPConnectorException, OSError) as exc:
        raise TransportError(f"{exc!r}{_port_hint(address, exc)}") from None
    _widen_reads(conn)
    return conn


def _port_hint(address: AmqpAddress, exc: BaseException) -> str:
    """Why a connection may have failed when one side speaks TLS and the other does not."""
    if address.tls is not None and isinstance(exc, ssl.SSLError):
        return " (is that port plain AMQP? RabbitMQ's TLS listener is usually 5671)"
    if address.tls is None and isinstance(exc, px.IncompatibleProtocolError):
        return " (is that port RabbitMQ's TLS listener? use amqps:// or tls=)"
    return ""


def connect_blocking(
    address: AmqpAddress, deadline: float | None, name: str
) -> pika.BlockingConnection:
    """Open a pika connection, retrying with backoff until ``deadline`` while the broker does
    not answer (:class:`TransportTimeout` then); a refused credential raises at once."""
    return dial(
        lambda d: _connect_once(address, d, name),
        what=f"RabbitMQ at {address.where} (is it running?)",
        timeout=remaining(deadline),
    )


def _close_quietly(conn: pika.BlockingConnection | None) -> None:
    if conn is not None and conn.is_open:
        with contextlib.suppress(px.AMQPError, OSError):  # already broken: nothing to close
            conn.close()


def _props(sender: str) -> pika.BasicProperties:
    return pika.BasicProperties(headers={_CLIENT_HEADER: sender}, delivery_mode=_PERSISTENT)


def _sender_of(props: Any) -> str:
    """The ``tw-client`` header if it is a valid client id, else ``?``."""
    headers = props.headers
    cid = headers.get(_CLIENT_HEADER) if isinstance(headers, dict) else None
    if isinstance(cid, bytes):
        cid = cid.decode("utf-8", "replace")
    return cid if isinstance(cid, str) and CLIENT_ID.match(cid) else "?"


def _declare_queue(ch: Any, queue: str) -> None:
    ch.queue_declare(queue, durable=True, arguments=_QUEUE_ARGS)


class _Admin:
    """A channel for binds and probes, on the consumer's connection and thread: a refusal
    (404: the queue is gone) closes it, so each gets its own channel and a new one follows."""

    def __init__(self, conn: pika.BlockingConnection) -> None:
        self._conn = conn
        self._ch = conn.channel()

    def run(self, op: Callable[[Any], Any]) -> bool:
        """Run ``op(channel)``; False if the broker refused it."""
        try:
            op(self._ch)
            return True
        except px.ChannelClosedByBroker as exc:
            log.debug("amqp: broker refused: %s", exc.reply_text)
            self._ch = self._conn.channel()
            return False

    def consumers(self, queue: str) -> int:
        """How many consumers ``queue`` has (0 if it does not exist)."""
        found: list[int] = []
        self.run(
            lambda ch: found.append(ch.queue_declare(queue, passive=True).method.consumer_count)
        )
        return found[0] if found else 0


# -- MACs on the broker (docs/security.md) ---------------------------------------------------


def _sealed_body(parts: Sequence[Any], sealer: Sealer | None) -> bytes:
    """One AMQP message body: the chunk made of ``parts``, and its trailer if there is a
    ``sealer`` (pika takes bytes only: the one copy a send makes)."""
    return b"".join(parts if sealer is None else [*parts, sealer(parts)])


def _unsealed(
    body: bytes, key: bytes, sender: bytes, window: ReplayWindow, redelivered: bool
) -> memoryview | None:
    """The chunk a sealed body from ``sender`` carries, once its MAC and sequence number are
    checked; :class:`AuthenticationError` if it is missing, forged, altered or replayed.

    None for the broker's redelivery: it sets ``redelivered`` on a delivery it made before
    whose acknowledgement it did not get (our connection dropped), which no other user of the
    broker can make it do, so an authentic body seen before that comes so is a duplicate.
    """
    view = memoryview(body)
    try:
        return unseal(view, key, sender, window)
    except AuthenticationError:
        if redelivered:
            with contextlib.suppress(AuthenticationError):
                unseal(view, key, sender, ReplayWindow())  # authentic: refused as a repeat
                return None
        raise


def _lone_chunk(body: bytes) -> memoryview | None:
    """The message a body carries if it is one unsealed chunk of at most the session
    messages' size, else None (a sealed body has bytes past its chunk)."""
    try:
        head, payload = parse_chunk(body)
    except WireError:
        return None
    if head.count != 1 or len(payload) != head.total_length or len(payload) > CONTROL_CHUNK:
        return None
    return payload


def _session_message(payload: Any) -> Message | None:
    """A session message decoded under the hello limits, or None if it is none."""
    try:
        msg = decode_message(payload, limits=HELLO_LIMITS)
    except WireError:
        return None
    return msg if msg.kind in ("hello", "welcome", "refuse", "bye") else None


def _refusal(exc: SessionRefused, session: Any) -> EncodedMessage:
    """:meth:`HubSession.refusal`, naming the session the hello opened (if it named a valid
    one): a client takes only the refusal of its own session."""
    meta = dict(decode_message(HubSession.refusal(exc).to_bytes(), limits=HELLO_LIMITS).meta)
    if isinstance(session, str) and 1 <= len(session) <= 64:
        meta["session"] = session
    return encode_message(None, meta, kind="refuse")


def _say(
    ch: Any, queue: str, enc: EncodedMessage, sender: str, sealer: Sealer | None = None
) -> bool:
    """Publish a session message to ``queue`` on the confirming channel ``ch``, sealed if
    there is a ``sealer``; False if no queue takes it (its owner left) or the broker refused it."""
    try:
        for parts in iter_chunks(enc.frames(), new_message_id(), CONTROL_CHUNK):
            body = _sealed_body(parts, sealer)
            ch.basic_publish("", queue, body, _props(sender), mandatory=True)
        return True
    except (px.UnroutableError, px.NackError) as exc:
        log.debug("amqp: a session message to %r not taken: %r", queue, exc)
        return False


# -- publishing -------------------------------------------------------------------------------


class _Publisher:
    """A confirming publisher connection, shared by threads under :attr:`lock`.

    Opened on first use and again whenever the broker connection is lost; a chunk whose
    confirm did not come is published again on the new connection (a receiver drops a repeated
    message id) until the send's deadline, or :data:`RECONNECT_TIMEOUT` without one.
    """

    def __init__(self, address: AmqpAddress, name: str, sender: str) -> None:
        self._address = address
        self._name = name
        self._props = _props(sender)
        self.lock = threading.Lock()
        self._conn: pika.BlockingConnection | None = None
        self._ch: Any = None
        self._last_used = time.monotonic()
        self._closed = False
        heartbeat = address.params.heartbeat
        # Serviced often enough for pika to send its heartbeats (every heartbeat / 2) in time.
        self._keepalive = (
            min(KEEPALIVE, heartbeat / 4)
            if isinstance(heartbeat, int) and heartbeat > 0
            else KEEPALIVE
        )

    def channel(self, deadline: float | None) -> Any:
        """The confirming channel, (re)connected until ``deadline``; call with :attr:`lock` held."""
        if self._closed:
            raise PeerGone("this endpoint is closed")
        if self._ch is None or not self._ch.is_open:
            if self._conn is None or not self._conn.is_open:
                self._conn = connect_blocking(
                    self._address, deadline or deadline_after(RECONNECT_TIMEOUT), self._name
                )
            self._ch = self._conn.channel()
            self._ch.confirm_delivery()
        return self._ch

    def publish(
        self,
        exchange: str,
        routing_key: str,
        enc: EncodedMessage,
        chunk: int,
        deadline: float | None,
        sealer: Sealer | None = None,
    ) -> None:
        """Publish ``enc`` as chunks of ``chunk`` bytes, each sealed if there is a ``sealer``
        (as it goes, so the numbers follow the publishes); return once the broker confirmed
        all."""
        with self.lock:
            self.publish_locked(exchange, routing_key, enc, chunk, deadline, sealer)

    def publish_locked(
        self,
        exchange: str,
        routing_key: str,
        enc: EncodedMessage,
        chunk: int,
        deadline: float | None,
        sealer: Sealer | None = None,
    ) -> None:
        """:meth:`publish` for a caller that holds :attr:`lock` already."""
        self._last_used = time.monotonic()
        target = routing_key or exchange
        for parts in iter_chunks(enc.frames(), new_message_id(), chunk):
            if remaining(deadline) == 0.0:
                raise TransportTimeout(f"sending to {target!r} ran out of time")
            body = _sealed_body(parts, sealer)
            self._publish_chunk(exchange, routing_key, body, sealer, deadline, target)

    def _publish_chunk(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        sealer: Sealer | None,
        deadline: float | None,
        target: str,
    ) -> None:
        limit = deadline  # a send without a deadline gets RECONNECT_TIMEOUT once the broker goes
        delay = 0.05
        while True:
            try:
                ch = self.channel(limit)
                ch.basic_publish(exchange, routing_key, body, self._props, mandatory=True)
                return
            except px.UnroutableError:
                raise PeerGone(f"no queue takes messages for {target!r}: its owner left") from None
            except px.NackError:
                raise TransportError(f"the broker refused a message for {target!r}") from None
            except px.ChannelClosedByBroker as exc:
                self._ch = None
                if exc.reply_code == 404:
                    raise PeerGone(f"{target!r} is gone: {exc.reply_text}") from None
                hint = " (lower chunk= in the URL)" if exc.reply_code == 406 else ""
                raise TransportError(
                    f"the broker closed the channel: {exc.reply_text}{hint}"
                ) from None
            except TransportError:  # no broker within the deadline, a refusal, or closed
                raise
            except (px.AMQPError, OSError) as exc:  # the connection is lost: send it again
                _close_quietly(self._conn)
                self._conn = self._ch = None
                if limit is None:
                    limit = deadline_after(RECONNECT_TIMEOUT)
                log.info("amqp: lost RabbitMQ sending to %r (%r); sending again", target, exc)
                if sealer is not None:  # the first may have arrived: a new number, not a replay
                    body = sealer.reseal(body)
            left = remaining(limit)
            if left == 0.0:
                raise TransportTimeout(f"RabbitMQ did not come back in time to send to {target!r}")
            time.sleep(min(delay, left or 0.0))
            delay = min(delay * 2, 1.0)

    def keepalive(self) -> None:
        """Let an idle connection answer heartbeats; skipped while another thread publishes."""
        idle = time.monotonic() - self._last_used
        if idle < self._keepalive or not self.lock.acquire(blocking=False):
            return
        try:
            if self._conn is not None and self._conn.is_open:
                self._conn.process_data_events(0)
            self._last_used = time.monotonic()
        except (px.AMQPError, OSError):  # lost: the next publish reconnects
            _close_quietly(self._conn)
            self._conn = self._ch = None
        finally:
            self.lock.release()

    def close(self) -> None:
        with self.lock:
            self._closed = True
            _close_quietly(self._conn)
            self._conn = self._ch = None


# -- consuming --------------------------------------------------------------------------------


class _Inflow:
    """Chunks in, whole messages out, per sender, each message id once.

    One-chunk messages skip the reassembler (no copy) and a bounded set of their ids drops a
    repeat; longer ones go through a :class:`ChunkReassembler`, whose done-keys drop theirs.
    """

    def __init__(self, limits: Limits) -> None:
        self.timeout = REASSEMBLY_TIMEOUT
        self._chunks = ChunkReassembler(
            max_message_bytes=limits.max_message_bytes,
            timeout=self.timeout,
            max_pending=MAX_PENDING,
        )
        self._seen: OrderedDict[tuple[Hashable, int], None] = OrderedDict()
        self._first: dict[tuple[Hashable, int], float] = {}  # when a pending one began to arrive

    def feed(self, body: bytes, now: float, source: Hashable) -> tuple[Any, float] | None:
        """The whole message and its first chunk's arrival time, once ``body`` completes a
        message not seen before; ``ChunkError`` / ``MessageTooLarge`` for a bad chunk."""
        head, payload = parse_chunk(body)
        key = (source, head.message_id)
        if head.count == 1:  # the common small message: no reassembly copy
            if len(payload) != head.total_length:
                raise ChunkError(f"single chunk of {len(payload)} bytes, says {head.total_length}")
            if key in self._seen:
                return None
            self._seen[key] = None
            if len(self._seen) > MAX_SEEN:
                self._seen.popitem(last=False)
            return payload, now
        data = self._chunks.feed(body, now, source)
        if data is None:
            if self._chunks.is_pending(head.message_id, source):  # not a late duplicate
                self._first.setdefault(key, now)
            return None
        return data, self._first.pop(key, now)

    def expire(self, now: float) -> list[tuple[Hashable, ChunkError]]:
        """Drop messages whose chunks stopped coming; return (sender, error) for each."""
        out = []
        for partial in self._chunks.expire(now):
            self._first.pop((partial.source, partial.message_id), None)
            lost = sum(n for _, n in partial.missing)
            error = ChunkError(
                f"message {partial.message_id:#x} dropped: {lost} of {partial.total_length} "
                f"bytes never arrived within {self.timeout} s"
            )
            out.append((partial.source, error))
        return out


class _Stopped(Exception):
    """The consumer was stopped while it reconnected (not an ``OSError``: ends ``dial``)."""


class _Consumer(threading.Thread):
    """Owns the consuming connection: runs its deliveries and ``tick()`` until :meth:`stop`.

    The first connection is made (retried until ``deadline``) and ``setup(conn)`` run on it in
    the constructor, so their errors are the caller's. When the broker connection is lost it
    calls ``on_lost(exc)``, reconnects with backoff, runs ``setup`` on the new connection and
    calls ``on_back(seconds it was down)``; after :data:`OUTAGE_LIMIT` seconds in vain,
    ``on_gone(exc)``, which says whether to keep trying.
    """

    def __init__(
        self,
        address: AmqpAddress,
        name: str,
        deadline: float | None,
        *,
        setup: Callable[[pika.BlockingConnection], None],
        tick: Callable[[], None],
        on_lost: Callable[[Exception], None],
        on_back: Callable[[float], None],
        on_gone: Callable[[Exception], bool],
    ) -> None:
        super().__init__(name=f"tensorwire-amqp-{name}", daemon=True)
        self._label = name
        self._address = address
        self._conn_name = f"tensorwire {name}"
        self._setup = setup
        self._tick = tick
        self._on_lost = on_lost
        self._on_back = on_back
        self._on_gone = on_gone
        self._stopping = False
        self.conn = connect_blocking(address, deadline, self._conn_name)
        try:
            setup(self.conn)
        except BaseException:
            _close_quietly(self.conn)
            raise

    def _reopen(self, deadline: float | None) -> pika.BlockingConnection:
        """One attempt at a new connection, set up; every failure is for ``dial`` to retry."""
        if self._stopping:
            raise _Stopped
        conn = _connect_once(self._address, deadline, self._conn_name)
        try:
            self._setup(conn)
        except (px.AMQPError, OSError) as exc:
            _close_quietly(conn)
            raise TransportError(f"setting up a new connection: {exc!r}") from None
        return conn

    def run(self) -> None:
        try:
            while not self._stopping:
                try:
                    self.conn.process_data_events(time_limit=TICK)
                    self._tick()
                    continue
                except (px.AMQPError, OSError) as exc:
                    lost: Exception = exc
                except Exception as exc:  # a bug in a callback must not end consuming for good
                    log.exception("amqp: %s: unexpected error; reconnecting", self._label)
                    lost = exc
                if self._stopping:
                    return
                _close_quietly(self.conn)
                self._reconnect(lost)
        finally:
            _close_quietly(self.conn)

    def _reconnect(self, lost: Exception) -> None:
        log.warning("amqp: %s lost RabbitMQ (%r); reconnecting", self._label, lost)
        self._on_lost(lost)
        started = time.monotonic()
        while True:
            try:
                self.conn = dial(
                    self._reopen, what=f"RabbitMQ at {self._address.where}", timeout=OUTAGE_LIMIT
                )
                break
            except _Stopped:
                self._stopping = True
                return
            except TransportError as exc:
                if not self._on_gone(exc):
                    self._stopping = True
                    return
        down = time.monotonic() - started
        log.warning("amqp: %s is back on RabbitMQ after %.1f s", self._label, down)
        self._on_back(down)

    def stop(self) -> None:
        """Stop consuming and close the connection (from the thread itself); wait for it."""
        self._stopping = True
        with contextlib.suppress(px.AMQPError, OSError):  # connection already gone
            self.conn.add_callback_threadsafe(lambda: None)  # wake process_data_events now
        if threading.current_thread() is not self and self.is_alive():
            self.join(timeout=10)


# -- hub --------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Peer:
    session: HubSession
    queue: str  # its session queue, bound to the fanout exchange
    hello: bytes = b""  # the hello that opened it: a copy of it is answered, not read
    window: ReplayWindow = field(default_factory=ReplayWindow)  # its sealed bodies' numbers


class AmqpHub(Hub):
    """Hub on a RabbitMQ broker; clients connect to :attr:`url` (it carries the prefix).

    ``chunk``: most bytes per AMQP message (default: the URL's, else :data:`DEFAULT_CHUNK`);
    ``liveness``: seconds between checks that each member's queue still has a consumer.
    ``tls`` is the link's TLS to the broker (its ``ca`` checks the broker's certificate, its
    ``cert`` is shown if the broker asks for one); ``auth`` the enrolled devices' keys, which
    admit clients here: the hub never sees a client's certificate, the broker does.
    """

    sees_client_certificates = False  # they reach the broker, never the hub

    protocol = "amqp"

    def __init__(
        self,
        url: str,
        *,
        chunk: int | None = None,
        liveness: float = 1.0,
        timeout: float = 30.0,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        address = AmqpAddress(url, self.tls)
        self.prefix = address.prefix or f"tw-{uuid.uuid4().hex[:12]}"
        self.chunk = _parse_chunk(chunk) if chunk is not None else address.chunk or DEFAULT_CHUNK
        self.url = address.url_with(self.prefix, address.chunk if chunk is None else self.chunk)
        self._where = address.where
        self._uplink = f"{self.prefix}.up"
        self._fanout = f"{self.prefix}.all"
        self._queue_prefix = f"{self.prefix}.c."
        self._liveness = liveness
        self._next_check = time.monotonic() + liveness
        self._peers: dict[str, _Peer] = {}  # members, by client id
        self._lock = threading.Lock()  # guards _peers
        self._unconsumed: dict[str, float] = {}  # member -> since when its queue has no consumer
        self._inflow = _Inflow(self.limits)
        self._seq = itertools.count()  # the numbers of the hub's sealed bodies, all sessions'
        self._pub = _Publisher(address, f"tensorwire hub {self.prefix} (send)", HUB)
        self._consumer = _Consumer(
            address,
            f"hub {self.prefix}",
            deadline_after(timeout),
            setup=self._setup,
            tick=self._tick,
            on_lost=self._medium_lost,
            on_back=self._medium_back,
            on_gone=self._medium_gone,
        )
        self._consumer.start()

    # -- consumer thread --------------------------------------------------------------------

    def _setup(self, conn: pika.BlockingConnection) -> None:
        """Declare the uplink and the fanout exchange and consume the uplink (exclusively)."""
        consuming = conn.channel()
        try:
            consuming.exchange_declare(self._fanout, "fanout", durable=True)
            _declare_queue(consuming, self._uplink)
            consuming.basic_qos(prefetch_count=PREFETCH)
            consuming.basic_consume(self._uplink, self._on_uplink, exclusive=True)
        except px.ChannelClosedByBroker as exc:
            raise TransportError(
                f"prefix {self.prefix!r} is in use by another hub on {self._where} "
                f"({exc.reply_text}); pick another prefix= in the URL"
            ) from None
        self._admin = _Admin(conn)  # a refused bind or probe never cancels the uplink consumer
        self._control = conn.channel()  # welcomes and refusals, confirmed
        self._control.confirm_delivery()

    def _on_uplink(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        sender = _sender_of(props)
        peer = None
        try:
            with self._lock:
                peer = self._peers.get(sender)
            if peer is None:
                self._from_stranger(sender, body)
            else:
                self._from_member(sender, peer, body, bool(method.redelivered))
        except (WireError, TransportError) as exc:
            self._rejected(sender if peer is not None else _STRANGER, exc)
        finally:
            ch.basic_ack(method.delivery_tag)

    def _from_stranger(self, sender: str, body: bytes) -> None:
        """A sender without a session: read only a hello, of one chunk, under HELLO_LIMITS.

        A hello sealed for a session this hub no longer has (it asks again after a reconnect)
        is read without its trailer, which nothing here can check: its own proof is checked.
        """
        view = memoryview(body)
        if len(view) >= CHUNK_HEADER_SIZE:  # the chunk ends where its header says
            total = parse_chunk(view[:CHUNK_HEADER_SIZE])[0].total_length
            view = view[: CHUNK_HEADER_SIZE + min(total, len(view))]
        head, payload = parse_chunk(view)
        if head.count != 1 or head.total_length > HELLO_LIMITS.max_message_bytes:
            raise ChunkError(
                f"{sender!r} has not joined: only a hello of one chunk of at most "
                f"{HELLO_LIMITS.max_message_bytes} bytes is read from it"
            )
        hello = bytes(payload)
        self._on_hello(sender, decode_message(hello, limits=HELLO_LIMITS), None, hello)

    def _from_member(self, sender: str, peer: _Peer, body: bytes, redelivered: bool) -> None:
        """A body from a member: with a session key, checked before it is reassembled."""
        chunk: Any = body
        key = peer.session.key
        if key is not None:
            try:
                chunk = _unsealed(body, key, sender.encode(), peer.window, redelivered)
            except AuthenticationError:
                # unsealed: only a hello is read, under the hello limits (a copy of the one
                # that opened the session, or one opening another session of this client)
                payload = _lone_chunk(body)
                msg = None if payload is None else _session_message(payload)
                if payload is None or msg is None or msg.kind != "hello":
                    raise
                self._on_hello(sender, msg, peer, bytes(payload))
                return
            if chunk is None:
                log.debug("amqp: dropped the broker's redelivery of %r's message", sender)
                return
        whole = self._inflow.feed(chunk, time.perf_counter(), sender)
        if whole is None:
            return
        msg = self._decode_whole(*whole)
        if msg.kind == "hello":
            self._on_hello(sender, msg, peer, sealed=key is not None)
            return
        hello = peer.session.hello
        assert hello is not None
        if msg.kind == "bye" and msg.meta.get("session") != hello.session:
            raise TransportError("a bye that names another session (stale or forged)")
        event = peer.session.receive(msg)
        if isinstance(event, Data):
            self._delivered(sender, msg)
        elif isinstance(event, Closed):
            self._forget(sender, peer, event.reason)
        else:
            assert isinstance(event, Ignored)  # an open session never joins again
            raise TransportError(event.reason)

    def _on_hello(
        self,
        sender: str,
        msg: Message,
        peer: _Peer | None,
        hello_bytes: bytes = b"",
        *,
        sealed: bool = False,
    ) -> None:
        """A hello from ``sender`` (``peer``: its session here, if any), as it came
        (``hello_bytes``, when unsealed) or ``sealed`` under its session key."""
        meta = msg.meta
        current = None if peer is None else peer.session.hello
        if (
            peer is not None
            and current is not None
            and meta.get("session") == current.session
            and (peer.session.key is None or sealed or hello_bytes == peer.hello)
        ):
            # The same session again: the client reconnected to the broker or missed the
            # welcome. Bind its recorded queue again (a broker that lost its state lost the
            # binding too) and answer as before; sealed if it asked sealed (it has the key).
            # A copy of the opening hello (a stranger may replay it) earns the welcome only.
            key = peer.session.key
            sealer = self._sealer([key]) if sealed and key is not None else None
            if self._admin.run(lambda ch: ch.queue_bind(peer.queue, self._fanout)):
                _say(self._control, peer.queue, peer.session.welcome(), HUB, sealer)
            return
        asked = meta.get("queue")
        ours = (
            isinstance(asked, str)
            and asked.startswith(f"{self._queue_prefix}{sender}.")
            and len(asked.encode()) <= _MAX_NAME
        )
        queue = asked if ours else None  # the queue to answer on: only one of ours
        session = HubSession(**self._session_options())
        try:
            session.receive(msg)  # version, fields, credential
            if meta.get("client_id") != sender:
                raise SessionRefused(
                    f"hello names client {meta.get('client_id')!r} but came as {sender!r}"
                )
            if queue is None:
                raise SessionRefused(f"hello: queue {asked!r} is not one of this hub's for it")
        except SessionRefused as exc:
            if queue is not None:
                _say(self._control, queue, _refusal(exc, meta.get("session")), HUB)
            self._refused(sender, exc)
            return
        hello = session.hello
        assert hello is not None
        if not self._admin.run(lambda ch: ch.queue_bind(queue, self._fanout)):
            log.info("amqp: %r's queue vanished before it joined", sender)
            return
        with self._lock:
            old = self._peers.get(sender)
            self._peers[sender] = _Peer(session, queue, hello_bytes)
        self._unconsumed.pop(sender, None)
        if old is not None and old.queue != queue:
            log.info("amqp: client %r reconnected; its old queue leaves the fanout", sender)
            self._admin.run(lambda ch: ch.queue_unbind(old.queue, self._fanout))
        # Joined before the welcome: once the client is connected, the hub knows its codecs
        # (data that overtakes the welcome waits in the client's inbox).
        self._joined(
            sender, hello.decoders, session=session, max_message_bytes=hello.max_message_bytes
        )
        _say(self._control, queue, session.welcome(), HUB)

    def _forget(self, client_id: str, peer: _Peer, reason: str, *, online: bool = True) -> None:
        """``client_id`` left (if ``peer`` is still its session); its queue leaves the fanout."""
        with self._lock:
            if self._peers.get(client_id) is not peer:
                return  # a session this hub has already replaced or dropped
            del self._peers[client_id]
        self._unconsumed.pop(client_id, None)
        if online:  # unconsumed and unbound, the broker deletes the queue after QUEUE_EXPIRES_MS
            self._admin.run(lambda ch: ch.queue_unbind(peer.queue, self._fanout))
        self._left(client_id, reason, session=peer.session)

    def _tick(self) -> None:
        for sender, exc in self._inflow.expire(time.perf_counter()):
            self._rejected(str(sender), exc)
        self._pub.keepalive()
        if time.monotonic() >= self._next_check:
            self._check_liveness()
            self._next_check = time.monotonic() + self._liveness

    def _check_liveness(self) -> None:
        """Members whose queue has had no consumer for LEAVE_GRACE seconds have left."""
        with self._lock:
            peers = list(self._peers.items())
        for cid, peer in peers:
            consumers = self._admin.consumers(peer.queue)
            now = time.monotonic()
            if consumers:
                self._unconsumed.pop(cid, None)
            elif now - self._unconsumed.setdefault(cid, now) >= LEAVE_GRACE:
                self._forget(
                    cid,
                    peer,
                    f"its connection to the broker dropped (its queue had no consumer for "
                    f"{LEAVE_GRACE:g} s)",
                )

    def _medium_lost(self, exc: Exception) -> None:
        self._event("medium-lost", None, f"lost RabbitMQ at {self._where}: {exc!r}")

    def _medium_back(self, down_s: float) -> None:
        self._unconsumed.clear()  # members get LEAVE_GRACE from now to reconnect too
        self._event("medium-back", None, f"RabbitMQ at {self._where} is back after {down_s:.1f} s")

    def _medium_gone(self, exc: Exception) -> bool:
        """No broker for OUTAGE_LIMIT seconds: the members have left; keep trying for new ones."""
        with self._lock:
            peers = list(self._peers.items())
        for cid, peer in peers:
            reason = f"RabbitMQ was unreachable for {OUTAGE_LIMIT:g} s ({exc})"
            self._forget(cid, peer, reason, online=False)
        return True

    # -- sending ----------------------------------------------------------------------------

    def _sealer(self, keys: list[bytes]) -> Sealer | None:
        """What seals the hub's bodies for sessions with these keys; None for none."""
        return Sealer(keys, _HUB_SENDER, self._seq) if keys else None

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        with self._lock:
            peer = self._peers.get(client_id)
        if peer is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        key = peer.session.key
        sealer = self._sealer([] if key is None else [key])
        self._pub.publish("", peer.queue, enc, self.chunk, deadline, sealer)

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """One publish to the fanout exchange when ``clients`` are all members, sealed with
        each one's key (if some sessions have a key and others none, one unicast each);
        else unicast."""
        with self._lock:
            members = list(self._peers.values())
            everyone = sorted(clients) == sorted(self._peers)
        keys = [p.session.key for p in members if p.session.key is not None]
        if not everyone or 0 < len(keys) < len(members):
            return super()._send_many(clients, enc, deadline)
        t = time.perf_counter()
        try:
            self._pub.publish(self._fanout, "", enc, self.chunk, deadline, self._sealer(keys))
        except TransportError as exc:
            return dict.fromkeys(clients, exc)
        return dict.fromkeys(clients, time.perf_counter() - t)

    def _close_transport(self) -> None:
        self._consumer.stop()
        with self._lock:
            peers = list(self._peers.values())
            self._peers.clear()
        deadline = deadline_after(BYE_TIMEOUT)
        goodbye = bye("the hub is closing")
        with self._pub.lock:
            for peer in peers:
                key = peer.session.key
                sealer = self._sealer([] if key is None else [key])
                with contextlib.suppress(TransportError):  # gone, or the broker is: done anyway
                    self._pub.publish_locked(
                        "", peer.queue, goodbye, CONTROL_CHUNK, deadline, sealer
                    )
            with contextlib.suppress(TransportError, px.AMQPError):
                ch = self._pub.channel(deadline_after(BYE_TIMEOUT))
                ch.queue_delete(self._uplink)
                ch.exchange_delete(self._fanout)
        self._pub.close()


# -- channel ----------------------------------------------------------------------------------


class AmqpChannel(Channel):
    """A client of an :class:`AmqpHub`; retries until ``timeout`` while the hub is not up.

    ``chunk``: most bytes per AMQP message (default: the URL's, else :data:`DEFAULT_CHUNK`).
    ``tls``: the link's TLS to the broker (its ``ca`` checks the broker's certificate, ``cert``
    is shown if the broker asks); ``key``: this device's enrolled secret, proven to the hub.
    """

    protocol = "amqp"

    def __init__(
        self,
        url: str,
        *,
        client_id: str | None = None,
        codec: Any = "auto",
        checksum: bool = True,
        limits: Limits = Limits(),
        timeout: float = 30.0,
        chunk: int | None = None,
        tls: TLS | None = None,
        key: Any = None,
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self._shown = redacted(url)  # the URL in messages: its password stays out of them
        self._credentials(tls, key)
        self._address = AmqpAddress(url, tls)
        if self._address.prefix is None:
            raise TransportError(
                f"{self._shown!r} names no hub: add ?prefix=... (the hub's .url has it)"
            )
        self.chunk = (
            _parse_chunk(chunk) if chunk is not None else self._address.chunk or DEFAULT_CHUNK
        )
        self.client_id = client_id or default_client_id()
        self._uplink = f"{self._address.prefix}.up"
        self._queue = ""
        if len(f"{self._address.prefix}.c.{self.client_id}.12345678".encode()) > _MAX_NAME:
            raise TransportError(f"client id {self.client_id!r} is too long for an AMQP queue name")
        self._cond = threading.Condition()  # guards _answer; notified when a session opens
        self._inbox = Inbox()
        self._consumer: _Consumer | None = None
        self._pub: _Publisher | None = None
        self._closed = True
        self.reconnect(timeout)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)join the hub under the same client id, with a fresh session and queue."""
        if not self._closed:
            self._drop()
        old_queue = self._queue
        self._queue = f"{self._address.prefix}.c.{self.client_id}.{uuid.uuid4().hex[:8]}"
        self._inbox = Inbox()
        self._inflow = _Inflow(self.limits)
        self._new_session()
        self._answer: Welcomed | Exception | None = None
        self._forged: AuthenticationError | None = None  # why a welcome was not the hub's
        self._rehello_at: float | None = None  # when to say hello again (after a reconnect)
        self._asking_since = 0.0  # when the hello said again after a reconnect began
        self._afresh = False  # asking in a new session: the hub no longer had ours
        self._hub_unconsumed: float | None = None
        self._next_hub_check = 0.0
        self._pub = _Publisher(self._address, f"tensorwire {self.client_id} (send)", self.client_id)
        self._closed = False
        try:
            welcome = dial(self._open, what=self._shown, timeout=timeout)
        except TransportTimeout:
            self._discard()
            if self._forged is None:
                raise
            raise AuthenticationError(
                f"no hub that knows {self.client_id!r}'s secret welcomed it at {self._shown} "
                f"within {timeout} s: {self._forged}"
            ) from None
        except BaseException:
            self._discard()
            raise
        self.hub_decoders = welcome.decoders
        self.hub_max_bytes = welcome.max_message_bytes
        if old_queue:
            self._delete_queue(old_queue)

    def _new_session(self) -> None:
        """A fresh session on our queue, with its hello (encoded once: every repeat is the same
        bytes, whose nonce the hub checks once) and the numbers of its sealed bodies, ours and
        the hub's."""
        self._session = self._client_session(f"the hub at {self._shown}", queue=self._queue)
        self._hello = self._session.hello()
        self._seq = itertools.count()
        self._window = ReplayWindow()
        self._early: list[tuple[str, bytes, bool]] = []  # the hub's, before the key to check them
        self._early_bytes = 0

    def _sealer(self) -> Sealer | None:
        """What seals this session's bodies once it has a key; None before, or without one."""
        key = self._session.key
        return None if key is None else Sealer([key], self.client_id.encode(), self._seq)

    def _open(self, deadline: float | None) -> Welcomed:
        """Consume our queue (once), say hello, and wait a while for the answer."""
        assert self._pub is not None
        if self._consumer is None:
            self._consumer = _Consumer(
                self._address,
                self.client_id,
                deadline,
                setup=self._setup,
                tick=self._tick,
                on_lost=self._medium_lost,
                on_back=self._medium_back,
                on_gone=self._medium_gone,
            )
            self._consumer.start()
        self._pub.publish("", self._uplink, self._hello, CONTROL_CHUNK, deadline)
        wait_until = min(time.monotonic() + HELLO_RETRY, deadline or float("inf"))
        with self._cond:
            while self._answer is None:
                left = remaining(wait_until)
                if left == 0.0:
                    raise TransportTimeout(
                        f"the hub at {self._shown} has not answered the hello yet"
                    )
                self._cond.wait(left)
            answer = self._answer
        if isinstance(answer, Exception):
            self._answer = None
            raise answer
        return answer

    # -- consumer thread --------------------------------------------------------------------

    def _setup(self, conn: pika.BlockingConnection) -> None:
        """Declare our queue and consume it (exclusively: a stale connection cannot take
        its messages)."""
        ch = conn.channel()
        _declare_queue(ch, self._queue)
        ch.basic_qos(prefetch_count=PREFETCH)
        ch.basic_consume(self._queue, self._on_delivery, exclusive=True)
        self._admin = _Admin(conn)  # looks at the uplink
        self._control = conn.channel()  # hellos said again, confirmed
        self._control.confirm_delivery()

    def _on_delivery(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        try:
            sender = _sender_of(props)
            if sender != HUB:
                raise TransportError(f"a message headed {_CLIENT_HEADER}: {sender!r}, not the hub")
            self._take(method.exchange, body, bool(method.redelivered))
        except AuthenticationError as exc:
            self._rejected(exc)
        except (WireError, TransportError) as exc:
            self._dropped(exc)
        finally:
            ch.basic_ack(method.delivery_tag)

    def _take(self, exchange: str, body: bytes, redelivered: bool) -> None:
        """A body headed as the hub's: checked (with a secret), reassembled, and data handed to
        ``recv``, session messages to the session."""
        chunk: Any = body
        if self.secret is not None:
            chunk = self._authentic(exchange, body, redelivered)
            if chunk is None:
                return
        whole = self._inflow.feed(chunk, time.perf_counter(), HUB)
        if whole is None:
            return
        buf, first = whole
        if len(buf) < PREFIX_SIZE:
            raise TruncatedMessage(f"{len(buf)} bytes is shorter than a message's prefix")
        if parse_prefix(buf, self.limits).body_length:  # tensors: recv decodes into its `out`
            self._inbox.put(whole)
            return
        msg = self._decode_whole(buf, first)
        if msg.kind == "data":
            self._inbox.put(msg)
        elif exchange:
            raise TransportError(
                f"a {msg.kind!r} message through {exchange!r}: the hub sends those to our queue"
            )
        else:
            self._on_session_message(msg, sealed=self.secret is not None)

    def _authentic(self, exchange: str, body: bytes, redelivered: bool) -> memoryview | None:
        """The chunk of a body the hub sealed for this session, checked; None when nothing is
        left to do with it: held until the welcome brings the key, the broker's redelivery, or
        an unsealed welcome or refusal, handled here. ``AuthenticationError`` for anything
        else: unsealed, forged, altered or replayed."""
        key = self._session.key
        error: AuthenticationError | None = None
        if key is not None:
            try:
                return _unsealed(body, key, _HUB_SENDER, self._window, redelivered)
            except AuthenticationError as exc:
                error = exc
        payload = _lone_chunk(body)
        msg = None if payload is None else _session_message(payload)
        if msg is None and key is None:
            self._hold(exchange, body, redelivered)
            return None
        if msg is None or exchange or msg.kind not in ("welcome", "refuse"):
            raise error or AuthenticationError(
                "an unsealed message on an authenticated session: the hub seals all but its "
                "first welcome and its refusals"
            )
        self._on_session_message(msg, sealed=False)
        return None

    def _hold(self, exchange: str, body: bytes, redelivered: bool) -> None:
        """Keep a body that may be the hub's, sealed, until the welcome's key can check it."""
        if self._early_bytes + len(body) > EARLY_BYTES:
            raise TransportError(f"more than {EARLY_BYTES} bytes came before the welcome")
        self._early.append((exchange, body, redelivered))
        self._early_bytes += len(body)

    def _check_early(self) -> None:
        """Check and take what came before the welcome, now that its key is here."""
        early, self._early, self._early_bytes = self._early, [], 0
        for exchange, body, redelivered in early:
            try:
                self._take(exchange, body, redelivered)
            except AuthenticationError as exc:
                self._rejected(exc)
            except (WireError, TransportError) as exc:
                self._dropped(exc)

    def _on_session_message(self, msg: Message, *, sealed: bool) -> None:
        """A welcome, refuse or bye sent to our queue by name (``sealed`` with the session key,
        or not)."""
        s = self._session
        named = msg.meta.get("session")
        # a refusal names the session it refuses (an older hub's names none: taken while asking)
        if (
            msg.kind == "refuse"
            and named != s.session
            and (named is not None or s.state is State.OPEN)
        ):
            raise TransportError("a refusal of another session (stale or forged)")
        if s.state is State.AWAIT_WELCOME:
            self._on_answer(msg)
        elif msg.kind == "welcome" and named == s.session:
            if sealed or self.secret is None:
                self._rehello_at = None  # the hub has us again after our reconnect
            else:  # a copy of the first welcome: it answers a hello said before it came
                log.debug("amqp: %s: an unsealed welcome again", self.client_id)
        elif msg.kind == "refuse":
            self._refused_again(msg)
        else:
            event = s.receive(msg)
            if isinstance(event, Closed):
                self._inbox.fail(s.closed_error())
            else:
                log.debug("amqp: %s: %s", self.client_id, event)

    def _on_answer(self, msg: Message) -> None:
        """The hub's answer to our hello (or something posing as it)."""
        s = self._session
        try:
            event = s.receive(msg)
        except AuthenticationError as exc:
            if s.state is not State.AWAIT_WELCOME:  # the hub refused our credential
                self._answered(exc)
            else:  # a welcome without proof of our secret: forged, or another hub's
                self._forged = exc
                self._rejected(exc)
            return
        except TransportError as exc:  # refused, another version, not a hub
            self._answered(exc)
            return
        if isinstance(event, Welcomed):
            self._answered(event)
            self._check_early()
        else:
            log.debug("amqp: %s: %s", self.client_id, event)

    def _answered(self, answer: Welcomed | Exception) -> None:
        with self._cond:
            if not self._afresh:  # connect() waits for it
                self._answer = answer
            elif isinstance(answer, Exception):
                self._inbox.fail(
                    PeerGone(
                        f"the hub at {self._shown} would not take {self.client_id!r} back: "
                        f"{answer}; call reconnect()"
                    )
                )
            else:
                log.info("amqp: %s: the hub took us back in a new session", self.client_id)
                self._afresh = False
                self._rehello_at = None
            self._cond.notify_all()

    def _refused_again(self, msg: Message) -> None:
        """The hub refused the hello our open session said again: it no longer has the
        session. With a secret the hub will not take that hello twice (its nonce is spent):
        ask in a new session, whose hello is new."""
        reason = msg.meta.get("reason", "no reason given")
        if self._rehello_at is None:
            raise TransportError(f"a refusal of our open session, which asked nothing: {reason}")
        if self.secret is None:
            self._inbox.fail(
                PeerGone(
                    f"the hub at {self._shown} would not take {self.client_id!r} back: "
                    f"{reason}; call reconnect()"
                )
            )
            return
        self._ask_afresh(f"it refused our session's hello ({reason})")

    def _ask_afresh(self, why: str) -> None:
        log.info(
            "amqp: %s: the hub no longer has our session: %s; asking anew", self.client_id, why
        )
        with self._cond:
            self._new_session()
            self._afresh = True
        self._rehello_at = self._asking_since = time.monotonic()

    def _dropped(self, exc: Exception) -> None:
        _log_limited(
            f"amqp dropped {self.client_id}",
            f"amqp: {self.client_id}: dropped a message that is not the hub's: {exc}",
        )

    def _tick(self) -> None:
        for _, exc in self._inflow.expire(time.perf_counter()):
            self._dropped(exc)
        if self._pub is not None:
            self._pub.keepalive()
        now = time.monotonic()
        if self._rehello_at is not None and now >= self._rehello_at:
            sealer = self._sealer()
            if sealer is not None and now - self._asking_since >= HUB_GRACE:
                # no answer to our sealed hello: the hub may have our session under another
                # key (a hub of its own started on the prefix took the first hello again)
                self._ask_afresh(f"it did not answer our sealed hello for {HUB_GRACE:g} s")
                sealer = None
            _say(self._control, self._uplink, self._hello, self.client_id, sealer)
            self._rehello_at = now + HELLO_RETRY
        joined = self._session.state is State.OPEN or self._afresh
        if joined and self._inbox.failed is None and now >= self._next_hub_check:
            self._check_hub(now)
            self._next_hub_check = now + HUB_CHECK

    def _check_hub(self, now: float) -> None:
        """The hub is gone once nobody has consumed the uplink for HUB_GRACE seconds."""
        if self._admin.consumers(self._uplink):
            self._hub_unconsumed = None
            return
        if self._hub_unconsumed is None:
            self._hub_unconsumed = now
        elif now - self._hub_unconsumed >= HUB_GRACE:
            self._inbox.fail(
                PeerGone(
                    f"the hub at {self._shown} is gone: nobody consumed its queue for "
                    f"{HUB_GRACE:g} s"
                )
            )

    def _medium_lost(self, exc: Exception) -> None:
        self._hub_unconsumed = None

    def _medium_back(self, down_s: float) -> None:
        self._hub_unconsumed = None
        if self._session.state is State.OPEN:  # the hub may have lost track of us meanwhile
            self._rehello_at = self._asking_since = time.monotonic()

    def _medium_gone(self, exc: Exception) -> bool:
        self._inbox.fail(PeerGone(f"lost RabbitMQ for {OUTAGE_LIMIT:g} s: {exc}"))
        return False

    # -- user threads -----------------------------------------------------------------------

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        while True:
            item = self._inbox.get(deadline)
            if isinstance(item, Message):
                return item
            buf, first = item  # a message with tensors, as _take put it
            try:
                msg = self._decode_whole(buf, first, out)
            except WireError as exc:
                self._dropped(exc)
                continue
            if msg.kind == "data":
                return msg
            self._dropped(TransportError(f"a {msg.kind!r} message with tensors"))

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed or self._pub is None:
            raise PeerGone("channel is closed; call reconnect()")
        if self._inbox.failed is not None:
            raise PeerGone(str(self._inbox.failed))
        sealer = self._sealer()
        if sealer is None and self.secret is not None:
            sealer = self._await_key(deadline)
        self._pub.publish("", self._uplink, enc, self.chunk, deadline, sealer)

    def _await_key(self, deadline: float | None) -> Sealer:
        """The sealer once the hub has welcomed the new session we asked in (it no longer had
        our old one), waiting until ``deadline`` (:data:`RECONNECT_TIMEOUT` without one)."""
        give_up = deadline if deadline is not None else deadline_after(RECONNECT_TIMEOUT)
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._session.key is not None or self._inbox.failed is not None or self._closed
                ),
                remaining(give_up),
            )
        if self._closed or self._inbox.failed is not None:
            raise PeerGone(str(self._inbox.failed or "channel is closed; call reconnect()"))
        sealer = self._sealer()
        if sealer is None:
            raise TransportTimeout(f"the hub at {self._shown} has not taken this client back yet")
        return sealer

    def _delete_queue(self, queue: str) -> None:
        """Delete one of our queues, if the broker answers within BYE_TIMEOUT."""
        assert self._pub is not None
        with self._pub.lock, contextlib.suppress(TransportError, px.AMQPError):
            self._pub.channel(deadline_after(BYE_TIMEOUT)).queue_delete(queue)

    def _drop(self) -> None:
        """Close both connections without a goodbye (the hub notices our queue goes unread)."""
        self._closed = True
        self._inbox.fail(PeerGone("channel is closed; call reconnect()"))
        if self._consumer is not None:
            self._consumer.stop()
            self._consumer = None
        if self._pub is not None:
            self._pub.close()

    def _discard(self) -> None:
        """Stop consuming, delete our queue and close, without a goodbye."""
        consuming = self._consumer is not None
        if self._consumer is not None:
            self._consumer.stop()
            self._consumer = None
        if consuming:
            self._delete_queue(self._queue)
        self._drop()

    def close(self) -> None:
        """Say goodbye to the hub, delete our queue and close both connections."""
        if self._closed:
            return
        assert self._pub is not None
        if self._session.state is State.OPEN and self._inbox.failed is None:
            goodbye = encode_message(None, {"session": self._session.session}, kind="bye")
            with contextlib.suppress(TransportError):  # hub or broker gone: nobody to tell
                self._pub.publish(
                    "",
                    self._uplink,
                    goodbye,
                    CONTROL_CHUNK,
                    deadline_after(BYE_TIMEOUT),
                    self._sealer(),
                )
        self._discard()


class AmqpsHub(AmqpHub):
    """:class:`AmqpHub` for ``amqps://`` URLs: the link to the broker runs TLS (port 5671 by
    default)."""

    protocol = "amqps"


class AmqpsChannel(AmqpChannel):
    """:class:`AmqpChannel` for ``amqps://`` URLs: the link to the broker runs TLS."""

    protocol = "amqps"
