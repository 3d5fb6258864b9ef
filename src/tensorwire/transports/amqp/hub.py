"""The hub of ``amqp://``: it consumes the uplink, opens sessions on hellos, binds members'
queues to the fanout exchange, and counts a member whose queue lost its consumer as gone after
a grace (see the package's docstring)."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import pika
import pika.exceptions as px

from tensorwire.errors import (
    AuthenticationError,
    ChunkError,
    SessionRefused,
    TransportError,
    WireError,
)
from tensorwire.transports.amqp.connection import Admin, declare_queue, sender_of
from tensorwire.transports.amqp.consumer import Consumer
from tensorwire.transports.amqp.control import refusal, say, session_message
from tensorwire.transports.amqp.publisher import Publisher
from tensorwire.transports.amqp.settings import (
    BYE_TIMEOUT,
    CONTROL_CHUNK,
    DEFAULT_CHUNK,
    HUB,
    LEAVE_GRACE,
    LIVENESS_PROBES,
    MAX_NAME,
    OUTAGE_LIMIT,
    PREFETCH,
    REASSEMBLY_TIMEOUT,
    AmqpAddress,
    AmqpHubOptions,
    parse_chunk_size,
)
from tensorwire.transports.base import HubOptions, deadline_after
from tensorwire.transports.broker import BrokerHub, BrokerPeer, lone_chunk, unsealed
from tensorwire.transports.security import Sealer
from tensorwire.transports.session import HELLO_LIMITS, Closed, Data, HubSession, Ignored, bye
from tensorwire.wire import CHUNK_HEADER_SIZE, EncodedMessage, Message, decode_message, parse_chunk

log = logging.getLogger("tensorwire.transports.amqp")

_STRANGER = "(not joined)"  # the hub's name in its errors for a sender without a session


@dataclass(eq=False)
class _Peer(BrokerPeer):
    queue: str = ""  # its session queue, bound to the fanout exchange


@dataclass(eq=False)
class _Hello:
    """A hello read and found good, to be answered once its queue is bound: a new session
    (``again`` False: recorded, then welcomed) or one the hub has, asking again (welcomed
    again, sealed by ``sealer`` if it asked sealed)."""

    peer: _Peer
    again: bool = False
    sealer: Any = None


def _unbind(ch: Any, queue: str, exchange: str) -> None:
    ch.queue_unbind(queue, exchange)


class AmqpHub(BrokerHub[_Peer]):
    """Hub on a RabbitMQ broker; clients connect to :attr:`url` (it carries the prefix).

    The credentials' ``tls`` is the connection's TLS to the broker (its ``ca`` checks the
    broker's certificate, its ``cert`` is shown if the broker asks for one); their ``keys``
    admit clients here: the hub never sees a client's certificate, the broker does.
    """

    protocol = "amqp"
    options_type: ClassVar[type[HubOptions]] = AmqpHubOptions
    options: AmqpHubOptions

    def __init__(self, url: str, options: AmqpHubOptions) -> None:
        super().__init__(url, options, grace=LEAVE_GRACE, reassembly_timeout=REASSEMBLY_TIMEOUT)
        address = AmqpAddress(url, self.tls)
        chunk, liveness = options.chunk, options.liveness
        self.prefix = address.prefix or f"tw-{uuid.uuid4().hex[:12]}"
        self.chunk = (
            parse_chunk_size(chunk) if chunk is not None else address.chunk or DEFAULT_CHUNK
        )
        self.url = address.url_with(self.prefix, address.chunk if chunk is None else self.chunk)
        self._where = address.where
        self.connection_max = address.connection_max
        self._persistent = address.persistent
        self._uplink = f"{self.prefix}.up"
        self._fanout = f"{self.prefix}.all"
        self._queue_prefix = f"{self.prefix}.c."
        self._liveness = liveness
        self._probe_at = 0  # where the next liveness check starts among the members
        self._next_check = time.monotonic() + liveness
        self._hellos: dict[str, _Hello] = {}  # read from the uplink, not answered yet
        self._consumer = Consumer(
            address,
            f"hub {self.prefix}",
            deadline_after(options.timeouts.connect),
            setup=self._setup,
            tick=self._tick,
            on_lost=self._medium_lost,
            on_back=self._medium_back,
            on_gone=self._medium_gone,
        )
        self._pub = Publisher(self._consumer, HUB, address.persistent)  # on the same connection
        self._consumer.start()

    # -- consumer thread --------------------------------------------------------------------

    def _setup(self, conn: pika.BlockingConnection) -> None:
        """Declare the uplink and the fanout exchange and consume the uplink (exclusively)."""
        self._consuming = consuming = conn.channel()
        try:
            consuming.exchange_declare(self._fanout, "fanout", durable=True)
            declare_queue(consuming, self._uplink)
            consuming.basic_qos(prefetch_count=PREFETCH)
            consuming.basic_consume(self._uplink, self._on_uplink, exclusive=True)
        except px.ChannelClosedByBroker as exc:
            raise TransportError(
                f"prefix {self.prefix!r} is in use by another hub on {self._where} "
                f"({exc.reply_text}); pick another prefix= in the URL"
            ) from None
        self._admin = Admin(conn)  # a refused bind or probe never cancels the uplink consumer
        # Welcomes and refusals, unconfirmed: waiting for each confirm held up the next hello
        # (2,000 joining, issue #27). One that is lost is asked for again: a client says hello
        # until it is answered, and again after its connection came back.
        self._control = conn.channel()

    def _on_uplink(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        sender = sender_of(props)
        peer = None
        try:
            if sender in self._hellos:  # its hello first, as if it had been answered at once
                self._answer_hellos()
            peer = self._peer_of(sender)
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
                chunk = unsealed(body, key, sender.encode(), peer.window, redelivered)
            except AuthenticationError:
                # unsealed: only a hello is read, under the hello limits (a copy of the one
                # that opened the session, or one opening another session of this client)
                payload = lone_chunk(body)
                msg = None if payload is None else session_message(payload)
                if payload is None or msg is None or msg.kind != "hello":
                    raise
                self._on_hello(sender, msg, peer, bytes(payload))
                return
            if chunk is None:
                log.debug("amqp: dropped the broker's redelivery of %r's message", sender)
                return
        whole = self._inflow.feed(chunk, sender)
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
            self._hellos[sender] = _Hello(peer, again=True, sealer=sealer)
            return
        asked = meta.get("queue")
        ours = (
            isinstance(asked, str)
            and asked.startswith(f"{self._queue_prefix}{sender}.")
            and len(asked.encode()) <= MAX_NAME
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
                self._say(queue, refusal(exc, meta.get("session")))
            self._refused(sender, exc)
            return
        self._hellos[sender] = _Hello(_Peer(session, hello_bytes, queue=queue))

    def _say(self, queue: str, enc: EncodedMessage, sealer: Sealer | None = None) -> None:
        """A session message to ``queue``, unconfirmed (see :meth:`_answer_hellos`)."""
        say(self._control, queue, enc, HUB, sealer, self._persistent)

    def _answer_hellos(self) -> None:
        """Answer the hellos read since the last call: bind their queues to the fanout (one
        round trip for all, :meth:`Admin.bind_all`), then record each new session and welcome
        it, without waiting for the broker's confirm. A connection lost meanwhile leaves them
        to be answered on the next one."""
        if not self._hellos:
            return
        hellos = list(self._hellos.items())
        bound = self._admin.bind_all([h.peer.queue for _, h in hellos], self._fanout)
        self._hellos.clear()
        for (sender, h), ok in zip(hellos, bound, strict=True):
            peer = h.peer
            if h.again:
                if ok:
                    self._say(peer.queue, peer.session.welcome(), h.sealer)
                continue
            if not ok:
                log.info("amqp: %r's queue vanished before it joined", sender)
                continue
            old = self._add_peer(sender, peer)
            if old is not None and old.queue != peer.queue:
                log.info("amqp: client %r reconnected; its old queue leaves the fanout", sender)
                self._admin.run(partial(_unbind, queue=old.queue, exchange=self._fanout))
            # Joined before the welcome: once the client is connected, the hub knows its
            # codecs (data that overtakes the welcome waits in the client's inbox).
            hello = peer.session.hello
            assert hello is not None
            self._joined(
                sender,
                hello.decoders,
                session=peer.session,
                max_message_bytes=hello.max_message_bytes,
            )
            self._say(peer.queue, peer.session.welcome())

    def _forget(self, client_id: str, peer: _Peer, reason: str) -> bool:
        """:meth:`BrokerHub._forget`; the queue leaves the fanout (unconsumed and unbound, the
        broker deletes it after QUEUE_EXPIRES_MS)."""
        if not super()._forget(client_id, peer, reason):
            return False
        self._admin.run(lambda ch: ch.queue_unbind(peer.queue, self._fanout))
        return True

    def _tick(self) -> None:
        self._answer_hellos()  # those the last round of deliveries brought
        if time.monotonic() >= self._next_check:
            self._check_liveness()
            self._next_check = time.monotonic() + self._liveness
        super()._tick()

    def _check_liveness(self) -> None:
        """A member whose queue has no consumer is suspected; gone after LEAVE_GRACE seconds.

        Suspects are looked at every check; of the others :data:`LIVENESS_PROBES` per check,
        in turn: each look is a round trip to the broker on this thread, which also admits
        new members (every member every second would cost it N round trips a second)."""
        with self._lock:
            members = list(self._peers.items())
            suspects = [(cid, peer) for cid, peer in members if cid in self._graces]
        start = self._probe_at % len(members) if members else 0
        turn = (members[start:] + members[:start])[:LIVENESS_PROBES]
        self._probe_at = start + len(turn)
        peers = suspects + [m for m in turn if m[0] not in self._graces]
        why = (
            f"its connection to the broker dropped (its queue had no consumer for "
            f"{LEAVE_GRACE:g} s)"
        )
        for cid, peer in peers:
            consumers = self._admin.consumers(peer.queue)
            with self._lock:
                if consumers:
                    self._graces.clear(cid)
                else:
                    self._graces.suspect(cid, why, time.monotonic(), again=False)

    def _medium_gone(self, exc: Exception) -> bool:
        """No broker for OUTAGE_LIMIT seconds: the members have left; keep trying for new ones."""
        with self._lock:
            peers = list(self._peers.items())
        for cid, peer in peers:  # offline: no queue to unbind
            BrokerHub._forget(
                self, cid, peer, f"RabbitMQ was unreachable for {OUTAGE_LIMIT:g} s ({exc})"
            )
        return True

    # -- sending ----------------------------------------------------------------------------

    def _publish_to(
        self, client_id: str, peer: _Peer, enc: EncodedMessage, deadline: float | None, sealer: Any
    ) -> None:
        self._pub.publish("", peer.queue, enc, self.chunk, deadline, sealer)

    def _publish_all(self, enc: EncodedMessage, deadline: float | None, sealer: Any) -> None:
        self._pub.publish(self._fanout, "", enc, self.chunk, deadline, sealer)

    def _unicasts(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """One after another: they all go through the one connection's thread anyway, and
        from a callback on that thread, worker threads would wait for it while it waits."""
        results: dict[str, float | Exception] = {}
        for client in clients:
            t = time.perf_counter()
            try:
                self._send_encoded(client, enc, deadline)
                results[client] = time.perf_counter() - t
            except Exception as exc:  # the caller's result for that client
                results[client] = exc
        return results

    def _close_transport(self) -> None:
        with contextlib.suppress(TransportError, px.AMQPError):  # no more hellos and data
            self._consumer.call(lambda _: self._consuming.close(), deadline_after(BYE_TIMEOUT))
        with self._lock:
            peers = list(self._peers.values())
            self._peers.clear()
        deadline = deadline_after(BYE_TIMEOUT)
        goodbye = bye("the hub is closing")
        for peer in peers:
            sealer = self._sealer(self._keys([peer]))
            with contextlib.suppress(TransportError):  # gone, or the broker is: done anyway
                self._pub.publish("", peer.queue, goodbye, CONTROL_CHUNK, deadline, sealer)

        def delete(ch: Any) -> None:
            ch.queue_delete(self._uplink)
            ch.exchange_delete(self._fanout)

        with contextlib.suppress(TransportError, px.AMQPError):
            self._pub.run(delete, deadline_after(BYE_TIMEOUT))
        self._pub.close()
        self._consumer.stop()


class AmqpsHub(AmqpHub):
    """:class:`AmqpHub` for ``amqps://`` URLs: the connection to the broker runs TLS (port 5671
    by default)."""

    protocol = "amqps"
