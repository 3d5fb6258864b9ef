"""``amqp://user:pass@host:port/vhost?prefix=NAME&chunk=BYTES``: tensorwire over RabbitMQ (pika).

Names, all under the hub's ``prefix`` (from the URL, else random; :attr:`AmqpHub.url` carries
it), so hubs sharing a broker never meet:

- ``PREFIX.up``: the uplink queue the hub consumes; exclusive to the hub's connection, so the
  broker deletes it when the hub goes, and a hello published to it is unroutable until the hub
  is up (clients retry until their timeout).
- ``PREFIX.c.CLIENT.SESSION``: one queue per client session, declared and consumed by the
  client *before* its hello (nothing the hub sends after the hello can be lost); auto-delete,
  so the broker deletes it when the client's connection drops.
- ``PREFIX.all``: a fanout exchange; the hub binds a client's queue to it when it accepts the
  hello, so its bindings are exactly the members and a broadcast to all of them is one publish.

Unicast goes through the default exchange to the session queue by name (AMQP's built-in
direct exchange): it reaches this session only, never a stale queue of a reconnected client.
Every AMQP message is one tensorwire chunk (``tensorwire.wire.iter_chunks``) of at most
``chunk`` bytes, under the broker's ``max_message_size`` (128 MiB by default), with the
sender's client id in the ``tw-client`` header; chunks are reassembled per sender. Publishes
use publisher confirms and ``mandatory``: a send returns once the broker holds every chunk,
and a chunk no queue would take raises ``PeerGone``. Clients say ``hello`` (meta: client_id,
decoders, version, queue) and ``bye``; the hub answers ``welcome`` and, on close, ``bye``.
A client whose connection drops without a bye is noticed by the hub's liveness check: every
``liveness`` seconds a passive declare of each member's queue, which the broker deleted.

Other query parameters go to pika (``heartbeat``, ``socket_timeout``, ``stack_timeout``,
``blocked_connection_timeout``, ...). Three have tensorwire defaults where the URL gives none,
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
connection belongs to one thread that consumes and does the bookkeeping; a publisher
connection is shared under a lock, so a big send never stalls receiving (on two cores the two
overlap) and user threads publish without handing buffers to another thread.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika
import pika.exceptions as px
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from tensorwire.errors import ChunkError, PeerGone, TransportError, TransportTimeout, WireError
from tensorwire.transports.base import (
    PROTOCOL_VERSION,
    Channel,
    Hub,
    control_message,
    deadline_after,
    default_client_id,
    remaining,
)
from tensorwire.wire import (
    ChunkReassembler,
    EncodedMessage,
    Limits,
    Message,
    iter_chunks,
    new_message_id,
    parse_chunk,
)

log = logging.getLogger("tensorwire.transports.amqp")

BROKER_MAX_MESSAGE = 128 << 20  # bytes: RabbitMQ's default max_message_size
DEFAULT_CHUNK = 4 << 20  # bytes per AMQP message: 1..8 MiB tie on loopback, 32+ MiB are slower
MIN_CHUNK = 1 << 10  # bytes
# Seconds a chunked message may go without a new chunk. Confirmed publishes lose no chunk while
# the sender is connected, but at 20 % loss TCP backoff makes one 2.3 MB message take up to
# 207 s, so a 4 MiB chunk can take far more than 60 s. Longer than a silent connection lives
# (see HEARTBEAT): this only bounds the memory of a sender that vanished mid-message.
REASSEMBLY_TIMEOUT = 600.0
QUEUE_EXPIRES_MS = 60_000  # a client queue never consumed (client died mid-connect) goes then
BYE_TIMEOUT = 2.0  # seconds spent saying goodbye before closing anyway
RECONNECT_TIMEOUT = 10.0  # seconds a send without a timeout waits for a lost broker to return
TICK = 0.5  # seconds between the consumer thread's bookkeeping rounds at most
KEEPALIVE = 10.0  # seconds between services of an idle publisher connection (heartbeats)
HEARTBEAT = 180  # seconds: tolerates a heartbeat ~95 s late (see the module's docstring)
CONNECT_TIMEOUT = 30.0  # seconds for a TCP connect: SYN retries at 1, 3, 7, 15 s fit
HANDSHAKE_TIMEOUT = 60.0  # seconds for connect + AMQP handshake (pika's 15 s fails at 20 % loss)
_PIKA_DEFAULTS = {
    "heartbeat": HEARTBEAT,
    "socket_timeout": CONNECT_TIMEOUT,
    "stack_timeout": HANDSHAKE_TIMEOUT,
}
_READ_BYTES = 1 << 16  # see _widen_reads
_MAX_NAME = 255  # bytes: AMQP short strings (queue and exchange names)
_CLIENT_HEADER = "tw-client"
_OUR_QUERY = ("prefix", "chunk")


# -- URL and connections ----------------------------------------------------------------------


class AmqpAddress:
    """An ``amqp://`` URL split into pika's connection parameters and tensorwire's options.

    ``prefix`` names the hub's queues and exchange (``None``: the hub picks one); ``chunk`` is
    the most bytes per AMQP message (``None``: :data:`DEFAULT_CHUNK`). :attr:`params` has
    tensorwire's ``heartbeat``, ``socket_timeout`` and ``stack_timeout`` unless the URL sets them.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "amqp":
            raise TransportError(f"{url!r} is not an amqp:// URL")
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {k: v for k, v in query if k in _OUR_QUERY}
        pika_url = urlunsplit(
            parts._replace(query=urlencode([q for q in query if q[0] not in ours]))
        )
        try:
            self.params = pika.URLParameters(pika_url)
        except ValueError as exc:
            raise TransportError(f"{url!r}: {exc}") from None
        given = {k for k, _ in query}
        for name, value in _PIKA_DEFAULTS.items():
            if name not in given:
                setattr(self.params, name, value)
        self.base = pika_url
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
        return f"{self.params.host}:{self.params.port} (vhost {self.params.virtual_host!r})"


def _parse_chunk(text: str | int) -> int:
    try:
        chunk = int(text)
    except ValueError:
        raise TransportError(f"chunk={text!r}: give the most bytes per AMQP message") from None
    if not MIN_CHUNK <= chunk <= BROKER_MAX_MESSAGE:
        raise TransportError(
            f"chunk={chunk}: must be {MIN_CHUNK}..{BROKER_MAX_MESSAGE} bytes (and under the "
            "broker's max_message_size)"
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


def connect_blocking(
    address: AmqpAddress, deadline: float | None, name: str
) -> pika.BlockingConnection:
    """Open a pika connection, retrying until ``deadline`` while the broker does not answer."""
    params = copy.copy(address.params)
    params.client_properties = {"connection_name": name, "product": "tensorwire"}
    delay = 0.05
    while True:
        left = remaining(deadline)
        if left is not None:  # one attempt must not outlast the deadline (but gets 1 s at least)
            left = max(left, 1.0)
            params.socket_timeout = min(address.params.socket_timeout or left, left)
            params.stack_timeout = min(address.params.stack_timeout or left, left)
        try:
            conn = pika.BlockingConnection(params)
        except (px.ProbableAuthenticationError, px.AuthenticationError) as exc:
            raise TransportError(
                f"RabbitMQ at {address.where} refused the credentials in the URL: {exc!r}"
            ) from None
        except px.ProbableAccessDeniedError as exc:
            raise TransportError(
                f"RabbitMQ at {address.where}: no access to the vhost: {exc!r}"
            ) from None
        # AMQPConnectorException: pika's stack_timeout during the handshake, not an AMQPError.
        except (px.AMQPConnectionError, AMQPConnectorException) as exc:
            if deadline is not None and time.monotonic() + delay > deadline:
                raise TransportTimeout(
                    f"could not connect to RabbitMQ at {address.where} ({exc!r}); is it running? "
                    "(tensorwire.transports.brokers.ensure_rabbitmq starts a private one)"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            continue
        _widen_reads(conn)
        return conn


def _close_quietly(conn: pika.BlockingConnection | None) -> None:
    if conn is not None and conn.is_open:
        with contextlib.suppress(px.AMQPError, OSError):  # already broken: nothing to close
            conn.close()


# -- publishing -------------------------------------------------------------------------------


class _Publisher:
    """A publishing connection with confirms, shared by threads under :attr:`lock`.

    Opened on first use and again after the broker closed it. Each publish is ``mandatory``:
    a chunk no queue takes raises ``PeerGone``.
    """

    def __init__(self, address: AmqpAddress, name: str, sender: str) -> None:
        self._address = address
        self._name = name
        self._props = pika.BasicProperties(headers={_CLIENT_HEADER: sender})
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

    def channel(self, deadline: float | None = None) -> Any:
        """The confirming pika channel, (re)opened if needed; call with :attr:`lock` held."""
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
    ) -> None:
        """Publish ``enc`` as chunks of ``chunk`` bytes; return once the broker confirmed all."""
        with self.lock:
            self.publish_locked(exchange, routing_key, enc, chunk, deadline)

    def publish_locked(
        self,
        exchange: str,
        routing_key: str,
        enc: EncodedMessage,
        chunk: int,
        deadline: float | None,
    ) -> None:
        """:meth:`publish` for a caller that holds :attr:`lock` already."""
        self._last_used = time.monotonic()
        ch = self._guard(lambda: self.channel(deadline), routing_key)
        for parts in iter_chunks(enc.frames(), new_message_id(), chunk):
            if remaining(deadline) == 0.0:
                raise TransportTimeout(f"sending to {routing_key or exchange} ran out of time")
            body = b"".join(parts)  # pika takes bytes only: the one copy a send makes
            self._guard(
                lambda body=body: ch.basic_publish(
                    exchange, routing_key, body, self._props, mandatory=True
                ),
                routing_key or exchange,
            )

    def _guard(self, op: Callable[[], Any], target: str) -> Any:
        try:
            return op()
        except px.UnroutableError:
            raise PeerGone(f"no queue takes messages for {target!r}: its owner left") from None
        except px.NackError:
            raise TransportError(f"the broker refused a message for {target!r}") from None
        except px.ChannelClosedByBroker as exc:
            hint = " (lower chunk= in the URL)" if exc.reply_code == 406 else ""
            raise TransportError(f"the broker closed the channel: {exc.reply_text}{hint}") from None
        except (px.AMQPConnectionError, px.ConnectionWrongStateError, OSError) as exc:
            _close_quietly(self._conn)
            self._conn = self._ch = None
            raise PeerGone(f"lost the connection to RabbitMQ: {exc!r}") from None

    def keepalive(self) -> None:
        """Let an idle connection answer heartbeats; skipped while another thread publishes."""
        idle = time.monotonic() - self._last_used
        if idle < self._keepalive or not self.lock.acquire(blocking=False):
            return
        try:
            if self._conn is not None and self._conn.is_open:
                self._conn.process_data_events(0)
            self._last_used = time.monotonic()
        except (px.AMQPError, OSError):
            self._conn = self._ch = None
        finally:
            self.lock.release()

    def close(self) -> None:
        with self.lock:
            self._closed = True
            _close_quietly(self._conn)
            self._conn = self._ch = None


# -- consuming --------------------------------------------------------------------------------


class _Assembler:
    """Chunks in, whole messages out, per sender; remembers when each message began arriving."""

    def __init__(self, limits: Limits) -> None:
        self._chunks = ChunkReassembler(
            max_message_bytes=limits.max_message_bytes, timeout=REASSEMBLY_TIMEOUT
        )
        self._first: dict[tuple[Hashable, int], float] = {}

    def feed(self, body: bytes, now: float, source: Hashable) -> tuple[Any, float] | None:
        """The whole message and its first chunk's arrival time, once ``body`` completes one."""
        head, payload = parse_chunk(body)
        if head.count == 1:  # the common small message: no reassembly copy
            if len(payload) != head.total_length:
                raise ChunkError(f"single chunk of {len(payload)} bytes, says {head.total_length}")
            return payload, now
        key = (source, head.message_id)
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
            out.append(
                (
                    partial.source,
                    ChunkError(
                        f"message {partial.message_id:#x} dropped: {lost} of "
                        f"{partial.total_length} bytes never arrived within {REASSEMBLY_TIMEOUT} s"
                    ),
                )
            )
        return out


class _ConsumerThread(threading.Thread):
    """Owns a consumer connection: runs its deliveries and ``tick()`` until :meth:`stop`."""

    def __init__(
        self,
        conn: pika.BlockingConnection,
        tick: Callable[[], None],
        on_lost: Callable[[Exception], None],
        name: str,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.conn = conn
        self._tick = tick
        self._on_lost = on_lost
        self._stopping = False

    def run(self) -> None:
        try:
            while not self._stopping:
                self.conn.process_data_events(time_limit=TICK)
                self._tick()
        except (px.AMQPError, OSError) as exc:
            if not self._stopping:
                log.warning("amqp: consumer connection lost: %r", exc)
                self._on_lost(exc)
        finally:
            _close_quietly(self.conn)

    def stop(self) -> None:
        """Stop consuming and close the connection (from the thread itself); wait for it."""
        self._stopping = True
        with contextlib.suppress(px.AMQPError, OSError):  # connection already gone
            self.conn.add_callback_threadsafe(lambda: None)  # wake process_data_events now
        if threading.current_thread() is not self:
            self.join(timeout=10)


def _sender_of(props: Any) -> str:
    cid = (props.headers or {}).get(_CLIENT_HEADER)
    if isinstance(cid, bytes):
        cid = cid.decode("utf-8", "replace")
    return cid if isinstance(cid, str) and cid else "?"


def _parse_hello(msg: Message, sender: str, queue_prefix: str) -> tuple[frozenset[str], str]:
    meta = msg.meta
    decoders = meta.get("decoders", [])
    queue = meta.get("queue")
    if meta.get("client_id") != sender:
        raise TransportError(f"hello names client {meta.get('client_id')!r}, sent by {sender!r}")
    if not isinstance(decoders, list) or not all(isinstance(d, str) for d in decoders):
        raise TransportError("hello: 'decoders' must be a list of codec ids")
    if not isinstance(queue, str) or not queue.startswith(queue_prefix):
        raise TransportError(f"hello: queue {queue!r} is not one of this hub's client queues")
    return frozenset(decoders), queue


# -- hub --------------------------------------------------------------------------------------


class AmqpHub(Hub):
    """Hub on a RabbitMQ broker; clients connect to :attr:`url` (it carries the prefix).

    ``chunk``: most bytes per AMQP message (default: the URL's, else :data:`DEFAULT_CHUNK`);
    ``liveness``: seconds between checks that each member's queue still exists.
    """

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
        address = AmqpAddress(url)
        self.prefix = address.prefix or f"tw-{uuid.uuid4().hex[:12]}"
        self.chunk = _parse_chunk(chunk) if chunk is not None else address.chunk or DEFAULT_CHUNK
        self.url = address.url_with(self.prefix, address.chunk if chunk is None else self.chunk)
        self._uplink = f"{self.prefix}.up"
        self._fanout = f"{self.prefix}.all"
        self._queue_prefix = f"{self.prefix}.c."
        self._liveness = liveness
        self._next_check = time.monotonic() + liveness
        self._queues: dict[str, str] = {}  # member -> its session queue, bound to the fanout
        self._bound = threading.Lock()  # held while the set of bound queues changes or is used
        self._assembler = _Assembler(self.limits)
        deadline = deadline_after(timeout)
        conn = connect_blocking(address, deadline, f"tensorwire hub {self.prefix}")
        try:
            consuming = conn.channel()
            try:
                consuming.queue_declare(self._uplink, exclusive=True)
            except px.ChannelClosedByBroker as exc:
                raise TransportError(
                    f"prefix {self.prefix!r} is in use by another hub on {address.where} "
                    f"({exc.reply_text}); pick another prefix= in the URL"
                ) from None
            consuming.exchange_declare(self._fanout, "fanout")
            consuming.basic_consume(self._uplink, self._on_uplink, auto_ack=True)
            # Binds and liveness probes fail with a channel error when a client's queue is
            # gone; they get their own channel so that never cancels the uplink consumer.
            self._admin = conn.channel()
        except BaseException:
            _close_quietly(conn)
            raise
        self._pub = _Publisher(address, f"tensorwire hub {self.prefix} (send)", "hub")
        self._consumer = _ConsumerThread(
            conn, self._tick, self._broker_lost, f"tensorwire-amqp-hub-{self.prefix}"
        )
        self._consumer.start()

    # -- consumer thread --------------------------------------------------------------------

    def _on_uplink(self, _ch: Any, _method: Any, props: Any, body: bytes) -> None:
        now = time.perf_counter()
        sender = _sender_of(props)
        try:
            whole = self._assembler.feed(body, now, sender)
            if whole is None:
                return
            msg = self._decode_whole(*whole)
        except WireError as exc:
            self._rejected(sender, exc)
            return
        if msg.kind == "data":
            if sender in self._queues:
                self._delivered(sender, msg)
            else:
                log.warning("amqp: dropped a message from %r, which has not joined", sender)
        elif msg.kind == "hello":
            self._on_hello(sender, msg)
        elif msg.kind == "bye":
            self._forget(sender, msg.meta.get("queue"), "said goodbye")
        else:
            log.debug("amqp: ignoring %r message from %r", msg.kind, sender)

    def _on_hello(self, sender: str, msg: Message) -> None:
        try:
            decoders, queue = _parse_hello(msg, sender, self._queue_prefix)
        except TransportError as exc:
            log.warning("amqp: refused a hello: %s", exc)
            return
        welcome = control_message(
            "welcome", {"decoders": self.decoders, "version": PROTOCOL_VERSION}
        )
        with self._bound:
            if not self._admin_op(lambda ch: ch.queue_bind(queue, self._fanout)):
                log.info("amqp: %r's queue vanished before it joined", sender)
                return
            old = self._queues.get(sender)
            if old is not None and old != queue:
                log.info("amqp: client %r reconnected; its old queue leaves the fanout", sender)
                self._admin_op(lambda ch: ch.queue_unbind(old, self._fanout))
            self._queues[sender] = queue
        # Joined before the welcome: once the client is connected, the hub knows its codecs
        # (the client keeps whatever data overtakes the welcome).
        self._joined(sender, decoders)
        try:
            self._pub.publish("", queue, welcome, self.chunk, deadline_after(BYE_TIMEOUT))
        except TransportError as exc:  # its queue is gone: the liveness check will notice
            log.warning("amqp: could not welcome %r: %s", sender, exc)

    def _admin_op(self, op: Callable[[Any], Any]) -> bool:
        """Run ``op(channel)`` on the admin channel; False if the broker refused (404: gone)."""
        try:
            op(self._admin)
            return True
        except px.ChannelClosedByBroker as exc:
            log.debug("amqp: broker refused: %s", exc.reply_text)
            self._admin = self._consumer.conn.channel()
            return False

    def _forget(self, client_id: str, queue: Any, reason: str) -> None:
        with self._bound:
            if client_id not in self._queues or queue not in (None, self._queues[client_id]):
                return  # a session this hub has already replaced or dropped
            del self._queues[client_id]
        self._left(client_id, reason)

    def _tick(self) -> None:
        for sender, exc in self._assembler.expire(time.perf_counter()):
            self._rejected(str(sender), exc)
        self._pub.keepalive()
        if time.monotonic() >= self._next_check:
            self._check_liveness()
            self._next_check = time.monotonic() + self._liveness

    def _check_liveness(self) -> None:
        """Members whose queue the broker deleted (their connection dropped) have left."""
        with self._bound:
            queues = list(self._queues.items())
        for cid, queue in queues:
            if not self._admin_op(lambda ch, q=queue: ch.queue_declare(q, passive=True)):
                self._forget(cid, queue, "its connection to the broker dropped")

    def _broker_lost(self, exc: Exception) -> None:
        with self._bound:
            gone = list(self._queues)
            self._queues.clear()
        for cid in gone:
            self._left(cid, f"the hub lost its broker connection: {exc!r}")

    # -- sending ----------------------------------------------------------------------------

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        queue = self._queues.get(client_id)
        if queue is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        self._pub.publish("", queue, enc, self.chunk, deadline)

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """One publish to the fanout exchange when ``clients`` are all members; else unicast."""
        with self._bound:
            if sorted(clients) == sorted(self._queues):
                t = time.perf_counter()
                try:
                    self._pub.publish(self._fanout, "", enc, self.chunk, deadline)
                except TransportError as exc:
                    return dict.fromkeys(clients, exc)
                wire_s = time.perf_counter() - t
                return dict.fromkeys(clients, wire_s)
        return super()._send_many(clients, enc, deadline)

    def _close_transport(self) -> None:
        with self._bound:
            members = bool(self._queues)
            self._queues.clear()
        with self._pub.lock:
            with contextlib.suppress(TransportError):  # clients gone or broker gone: done anyway
                if members:
                    bye = control_message("bye", {})
                    self._pub.publish_locked(
                        self._fanout, "", bye, self.chunk, deadline_after(BYE_TIMEOUT)
                    )
            with contextlib.suppress(TransportError, px.AMQPError):
                ch = self._pub.channel(deadline_after(BYE_TIMEOUT))
                ch.exchange_delete(self._fanout)
        self._pub.close()
        self._consumer.stop()  # closing its connection deletes the exclusive uplink queue


# -- channel ----------------------------------------------------------------------------------


class AmqpChannel(Channel):
    """A client of an :class:`AmqpHub`; retries until ``timeout`` while the hub is not up.

    ``chunk``: most bytes per AMQP message (default: the URL's, else :data:`DEFAULT_CHUNK`).
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
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self._address = AmqpAddress(url)
        if self._address.prefix is None:
            raise TransportError(f"{url!r} names no hub: add ?prefix=... (the hub's .url has it)")
        self.chunk = (
            _parse_chunk(chunk) if chunk is not None else self._address.chunk or DEFAULT_CHUNK
        )
        self.client_id = client_id or default_client_id()
        self._uplink = f"{self._address.prefix}.up"
        self._queue = ""
        if len(f"{self._address.prefix}.c.{self.client_id}.12345678".encode()) > _MAX_NAME:
            raise TransportError(f"client id {self.client_id!r} is too long for an AMQP queue name")
        self._cond = threading.Condition()
        self._inbox: deque[tuple[Any, float] | Exception] = deque()
        self._early: deque[Message] = deque()  # data that overtook the welcome
        self._consumer: _ConsumerThread | None = None
        self._pub: _Publisher | None = None
        self._closed = True
        self.reconnect(timeout)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)join the hub under the same client id, with a fresh queue."""
        if not self._closed:
            self._drop()
        deadline = deadline_after(timeout)
        self._queue = f"{self._address.prefix}.c.{self.client_id}.{uuid.uuid4().hex[:8]}"
        self._inbox.clear()
        self._early.clear()
        self._assembler = _Assembler(self.limits)
        conn = connect_blocking(self._address, deadline, f"tensorwire {self.client_id}")
        try:
            ch = conn.channel()
            ch.queue_declare(
                self._queue, auto_delete=True, arguments={"x-expires": QUEUE_EXPIRES_MS}
            )
            ch.basic_consume(self._queue, self._on_delivery, auto_ack=True)
        except BaseException:
            _close_quietly(conn)
            raise
        self._consumer = _ConsumerThread(
            conn, self._tick, self._push, f"tensorwire-amqp-{self.client_id}"
        )
        self._consumer.start()
        self._pub = _Publisher(self._address, f"tensorwire {self.client_id} (send)", self.client_id)
        self._closed = False
        try:
            self._say_hello(deadline, timeout)
            self.hub_decoders = frozenset(self._welcome(deadline, timeout).meta.get("decoders", []))
        except BaseException:
            self._drop()
            raise

    def _say_hello(self, deadline: float | None, timeout: float) -> None:
        assert self._pub is not None
        hello = control_message(
            "hello",
            {
                "client_id": self.client_id,
                "decoders": self.decoders,
                "version": PROTOCOL_VERSION,
                "queue": self._queue,
            },
        )
        delay = 0.05
        while True:
            try:
                self._pub.publish("", self._uplink, hello, self.chunk, deadline)
                return
            except PeerGone as exc:  # no uplink queue yet: the hub is not up
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise TransportTimeout(
                        f"no hub at {self.url} within {timeout} s ({exc})"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _welcome(self, deadline: float | None, timeout: float) -> Message:
        while True:
            buf, first = self._pop(deadline, f"the hub did not welcome us within {timeout} s")
            msg = self._decode_whole(buf, first)
            if msg.kind == "welcome":
                return msg
            if msg.kind != "data":
                raise TransportError(f"hub at {self.url} answered {msg.kind!r}, not welcome")
            self._early.append(msg)  # sent right after the hub counted us in

    # -- consumer thread --------------------------------------------------------------------

    def _on_delivery(self, _ch: Any, _method: Any, _props: Any, body: bytes) -> None:
        try:
            whole = self._assembler.feed(body, time.perf_counter(), "hub")
        except WireError as exc:
            self._push(exc)
            return
        if whole is not None:
            self._push(whole)

    def _push(self, item: tuple[Any, float] | Exception) -> None:
        if isinstance(item, Exception) and not isinstance(item, WireError):
            item = PeerGone(f"lost the connection to RabbitMQ: {item!r}")
        with self._cond:
            self._inbox.append(item)
            self._cond.notify_all()

    def _tick(self) -> None:
        for _, exc in self._assembler.expire(time.perf_counter()):
            self._push(exc)
        if self._pub is not None:
            self._pub.keepalive()

    # -- user threads -----------------------------------------------------------------------

    def _pop(self, deadline: float | None, what: str) -> tuple[Any, float]:
        with self._cond:
            while not self._inbox:
                left = remaining(deadline)
                if left == 0.0:
                    raise TransportTimeout(what)
                if self._closed:
                    raise PeerGone("channel is closed; call reconnect()")
                self._cond.wait(left)
            item = self._inbox.popleft()
        if isinstance(item, Exception):
            if isinstance(item, PeerGone):
                self._drop()
            raise item
        return item

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._early:
            return self._early.popleft()
        while True:
            buf, first = self._pop(deadline, "no message from the hub in time")
            msg = self._decode_whole(buf, first, out)
            if msg.kind == "data":
                return msg
            if msg.kind == "bye":
                self._drop()
                raise PeerGone(f"hub at {self.url} closed the session")

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed or self._pub is None:
            raise PeerGone("channel is closed; call reconnect()")
        self._pub.publish("", self._uplink, enc, self.chunk, deadline)

    def _drop(self) -> None:
        """Close both connections without a goodbye (the broker then deletes our queue)."""
        self._closed = True
        if self._consumer is not None:
            self._consumer.stop()
        if self._pub is not None:
            self._pub.close()
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Say goodbye to the hub and close both connections."""
        if self._closed:
            return
        assert self._pub is not None
        with contextlib.suppress(TransportError):  # hub or broker gone: nobody to tell
            self._pub.publish(
                "",
                self._uplink,
                control_message("bye", {"queue": self._queue}),
                self.chunk,
                deadline_after(BYE_TIMEOUT),
            )
        self._drop()
