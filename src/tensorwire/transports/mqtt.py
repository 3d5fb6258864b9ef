"""``mqtt://[user:pass@]host:port/prefix?qos=1&chunk=1048576``: tensors through an MQTT 5 broker.

Every payload published is one chunk (``tensorwire.wire.iter_chunks``) of a tensorwire message,
cut under the broker's maximum packet size. Topics under ``prefix``:

- ``prefix/up/<client>``: everything a client sends the hub: ``hello``, data, ``bye``, and the
  client's last will (a ``bye`` the broker publishes when the client's connection dies);
- ``prefix/down``: broadcasts (the broker's fan-out: one publish reaches every client);
- ``prefix/down/<client>``: messages to one client;
- ``prefix/ctl/<client>``: the hub's ``welcome``; ``prefix/ctl``: the hub's ``bye`` (and its will).

A client subscribes to its topics before it says hello, and repeats the hello until the hub
welcomes it, so neither start order nor a late hub loses a message. Each hello carries a fresh
session id, and a ``bye`` only counts for the session it names: a reconnected client is not
dropped by its old connection's will. Client-to-hub control shares the data topic so that MQTT's
per-topic ordering keeps a client's data ahead of its goodbye.

Publishing waits for the broker's acknowledgement of each chunk (PUBACK at QoS 1, PUBCOMP at
QoS 2; the socket write at QoS 0), a window of them in flight, so a send returns when the broker
holds the whole message. Each paho client runs its network loop in its own thread.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from tensorwire.errors import PeerGone, TransportError, TransportTimeout, WireError
from tensorwire.transports.base import (
    PROTOCOL_VERSION,
    Channel,
    Hub,
    control_message,
    deadline_after,
    remaining,
)
from tensorwire.transports.url import host_port
from tensorwire.wire import (
    CHUNK_HEADER_SIZE,
    PREFIX_SIZE,
    ChunkReassembler,
    EncodedMessage,
    Limits,
    Message,
    iter_chunks,
    new_message_id,
    parse_chunk,
)

log = logging.getLogger("tensorwire.transports.mqtt")

DEFAULT_PORT = 1883
DEFAULT_PREFIX = "tensorwire"
# Publish payload size, bytes. Through Mosquitto on loopback, 256 KiB to 4 MiB chunks move a
# 72 MB tensor alike; 16 MiB ones take ~1.5x as long and one 72 MB packet ~4x, because paho
# copies the unsent rest of a packet on every partial socket write.
DEFAULT_CHUNK_BYTES = 1 << 20
MQTT_MAX_PACKET = 268_435_455 + 5  # the protocol's largest remaining length + fixed header
# Mosquitto drops QoS 1/2 messages queued for a slow subscriber past max_queued_messages
# (1000 by default): bigger chunks keep one message well below that.
MAX_CHUNKS_PER_MESSAGE = 512
WINDOW_BYTES = 8 << 20  # published but unacknowledged, per send
# Seconds of MQTT keep-alive. paho drops its connection when a PINGRESP is a keep-alive late,
# the broker a client silent for 1.5 keep-alives (then sends its will). At 60 s a device lost
# its broker connection at 20 % loss ("Keep alive timeout"): TCP backoff stalls a connection
# for a minute or more. A connection that really closes is noticed at once either way.
KEEPALIVE_S = 180
# Seconds a chunked message may go without a new chunk before it counts as lost. At QoS 0 a
# chunk can be lost for good, so give up soon. At QoS 1/2 none is lost while the sender is
# connected (and when its connection dies its will says so), but on a lossy link TCP's
# retransmission backoff can stall one connection for tens of seconds: waiting 30 s then
# dropped whole updates at 20 % loss. So wait long; this only bounds a vanished sender's memory.
REASSEMBLY_TIMEOUT_S = {0: 30.0, 1: 600.0, 2: 600.0}
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before disconnecting anyway
HELLO_RETRY_S = (0.2, 2.0)  # first and longest wait for a welcome before saying hello again
_HUB_BYE = object()  # in a channel's inbox: the hub said goodbye
_NO_ENTRY = (134, 135)  # CONNACK reasons "bad user name or password", "not authorized"


@dataclass(frozen=True)
class MqttSettings:
    """What an ``mqtt://`` URL names: broker address, credentials, topic prefix, QoS, chunk size."""

    host: str
    port: int
    username: str | None
    password: str | None
    prefix: str
    qos: int
    chunk_bytes: int  # most bytes per published payload, chunk header included

    @classmethod
    def from_url(
        cls, url: str, qos: int | None = None, chunk_bytes: int | None = None
    ) -> MqttSettings:
        """Read ``url``; ``qos`` / ``chunk_bytes``, when given, override its query."""
        parts = urlsplit(url)
        if parts.scheme != "mqtt":
            raise TransportError(f"{url!r} is not an mqtt:// URL")
        host, port = host_port(url, default_port=DEFAULT_PORT)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"qos", "chunk"}
        if unknown:
            raise TransportError(f"{url!r}: unknown options {sorted(unknown)}; known: qos, chunk")
        try:
            qos = int(query.get("qos", 1)) if qos is None else qos
            chunk_bytes = (
                int(query.get("chunk", DEFAULT_CHUNK_BYTES)) if chunk_bytes is None else chunk_bytes
            )
        except ValueError:
            raise TransportError(f"{url!r}: qos and chunk must be integers") from None
        if qos not in (0, 1, 2):
            raise TransportError(f"{url!r}: qos must be 0, 1 or 2, not {qos}")
        if chunk_bytes <= CHUNK_HEADER_SIZE:
            raise TransportError(f"{url!r}: chunk must exceed {CHUNK_HEADER_SIZE} bytes")
        prefix = unquote(parts.path).strip("/") or DEFAULT_PREFIX
        if any(c in prefix for c in "+#\0"):
            raise TransportError(f"{url!r}: the topic prefix may not contain '+', '#' or NUL")
        return cls(
            host=host,
            port=port,
            username=unquote(parts.username) if parts.username is not None else None,
            password=unquote(parts.password) if parts.password is not None else None,
            prefix=prefix,
            qos=qos,
            chunk_bytes=chunk_bytes,
        )

    def up(self, client_id: str) -> str:
        return f"{self.prefix}/up/{client_id}"

    def down(self, client_id: str | None = None) -> str:
        return f"{self.prefix}/down" + (f"/{client_id}" if client_id else "")

    def ctl(self, client_id: str | None = None) -> str:
        return f"{self.prefix}/ctl" + (f"/{client_id}" if client_id else "")


def _control(kind: str, meta: dict[str, Any]) -> bytes:
    """A small control message as the one chunk that carries it."""
    enc = control_message(kind, meta)
    return b"".join(next(iter_chunks(enc.frames(), new_message_id(), enc.nbytes)))


def _no_delay(_client: Any, _userdata: Any, sock: Any) -> None:
    # paho leaves Nagle on: a small publish or PUBACK then waits ~40 ms for a delayed ACK.
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Link:
    """One paho client on its own network thread: connect, subscribe, publish chunked messages.

    ``on_message(topic, payload)`` and ``on_lost(reason)`` (the connection died unasked) are
    called from the network thread.
    """

    def __init__(
        self,
        settings: MqttSettings,
        *,
        will: tuple[str, bytes],
        on_message: Callable[[str, bytes], None],
        on_lost: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self._on_message = on_message
        self._on_lost = on_lost
        self.max_packet = MQTT_MAX_PACKET
        self._cond = threading.Condition()
        self._connack: Any = None  # the CONNACK's reason code, once it came
        self._subacks: dict[int, list[Any]] = {}
        self._closing = False
        self.lost: str | None = None
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"tw-{uuid.uuid4().hex[:20]}",
            protocol=MQTTProtocolVersion.MQTTv5,
            reconnect_on_failure=False,  # a lost session is reported, not silently re-made
        )
        if settings.username is not None:
            client.username_pw_set(settings.username, settings.password)
        client.will_set(will[0], will[1], qos=settings.qos)
        client.on_socket_open = _no_delay
        client.on_connect = self._connected
        client.on_disconnect = self._disconnected
        client.on_subscribe = self._subscribed
        client.on_message = lambda _c, _u, msg: self._on_message(msg.topic, msg.payload)
        self._client = client

    # -- network thread ---------------------------------------------------------------

    def _connected(self, _c: Any, _u: Any, _flags: Any, reason: Any, props: Any) -> None:
        size = getattr(props, "MaximumPacketSize", None)
        with self._cond:
            if size:
                self.max_packet = min(int(size), MQTT_MAX_PACKET)
            self._connack = reason
            self._cond.notify_all()

    def _disconnected(self, _c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        with self._cond:
            if self._closing:
                return
            self.lost = f"lost the connection to the broker ({reason})"
            self._cond.notify_all()
            established = self._connack is not None and not self._connack.is_failure
        if established:  # a refused connect is reported by connect() itself
            log.warning("mqtt: %s", self.lost)
            self._on_lost(self.lost)

    def _subscribed(self, _c: Any, _u: Any, mid: int, codes: list[Any], _props: Any) -> None:
        with self._cond:
            self._subacks[mid] = codes
            self._cond.notify_all()

    # -- caller's thread --------------------------------------------------------------

    def _address(self) -> str:
        return f"{self.settings.host}:{self.settings.port}"

    def connect(self, deadline: float | None, timeout: float | None) -> None:
        """Connect (retrying while nothing listens) and wait for the broker's CONNACK."""
        delay = 0.02
        while True:
            try:
                self._client.connect(
                    self.settings.host, self.settings.port, KEEPALIVE_S, clean_start=True
                )
                break
            except OSError as exc:  # broker not up yet: keep trying until the deadline
                left = remaining(deadline)
                if left is not None and left <= delay:
                    raise TransportTimeout(
                        f"no MQTT broker answers at {self._address()} within {timeout} s "
                        f"({exc}); start one (apt-get install mosquitto), or use "
                        "tensorwire.transports.brokers.ensure_mosquitto"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        self._client.loop_start()
        with self._cond:
            while self._connack is None and self.lost is None:
                left = remaining(deadline)
                if left == 0.0:
                    break
                self._cond.wait(left)
            reason = self._connack
        if reason is not None and not reason.is_failure:
            return
        self.close()
        if reason is None and self.lost:
            raise TransportError(f"the broker at {self._address()} hung up before accepting")
        if reason is None:
            raise TransportTimeout(f"the broker at {self._address()} did not accept in time")
        hint = " (check the user and password in the URL)" if reason.value in _NO_ENTRY else ""
        raise TransportError(
            f"the broker at {self._address()} refused the connection: {reason}{hint}"
        )

    def subscribe(self, topics: Sequence[str], deadline: float | None) -> None:
        """Subscribe to ``topics`` at the link's QoS and wait until the broker confirms."""
        rc, mid = self._client.subscribe([(t, self.settings.qos) for t in topics])
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise PeerGone(f"could not subscribe to {list(topics)}: {paho.error_string(rc)}")
        with self._cond:
            while mid not in self._subacks:
                left = remaining(deadline)
                if self.lost or left == 0.0:
                    raise TransportTimeout(f"the broker did not confirm subscribing to {topics}")
                self._cond.wait(left)
            codes = self._subacks.pop(mid)
        refused = [t for t, c in zip(topics, codes, strict=True) if c.is_failure]
        if refused:
            raise TransportError(
                f"the broker at {self._address()} refused subscriptions to {refused}: {codes}"
            )

    def chunk_payload(self, topic: str, total: int) -> int:
        """Message bytes per chunk on ``topic`` for a message of ``total`` bytes."""
        # fixed header 5, topic 2 + len, packet id 2, properties length 1; rounded up
        most = self.max_packet - 16 - len(topic.encode()) - CHUNK_HEADER_SIZE
        wanted = max(
            self.settings.chunk_bytes - CHUNK_HEADER_SIZE, -(-total // MAX_CHUNKS_PER_MESSAGE)
        )
        if most <= 0:
            raise TransportError(
                f"the broker's maximum packet of {self.max_packet} bytes is too small"
            )
        return min(wanted, most)

    def publish(self, topic: str, enc: EncodedMessage, deadline: float | None) -> None:
        """Publish a message as chunks; return when the broker acknowledged them all."""
        self.publish_chunks(
            topic,
            (
                b"".join(parts)  # paho takes bytes only
                for parts in iter_chunks(
                    enc.frames(), new_message_id(), self.chunk_payload(topic, enc.nbytes)
                )
            ),
            deadline,
        )

    def publish_chunks(self, topic: str, payloads: Iterable[bytes], deadline: float | None) -> None:
        """Publish ``payloads`` in order, a window of them unacknowledged; return when acked."""
        window: collections.deque[tuple[paho.MQTTMessageInfo, int]] = collections.deque()
        in_flight = 0
        for payload in payloads:
            window.append((self._publish(topic, payload), len(payload)))
            in_flight += len(payload)
            while in_flight > WINDOW_BYTES:
                info, n = window.popleft()
                self._wait(info, deadline)
                in_flight -= n
        for info, _ in window:
            self._wait(info, deadline)

    def publish_nowait(self, topic: str, payload: bytes) -> None:
        """Queue a small payload for publishing (safe from the network thread: no waiting)."""
        self._publish(topic, payload)

    def _publish(self, topic: str, payload: bytes) -> paho.MQTTMessageInfo:
        if self.lost:
            raise PeerGone(self.lost)
        info = self._client.publish(topic, payload, qos=self.settings.qos)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise PeerGone(f"could not publish on {topic!r}: {paho.error_string(info.rc)}")
        return info

    def _wait(self, info: paho.MQTTMessageInfo, deadline: float | None) -> None:
        # paho wakes this on the acknowledgement; the 1 s slices notice a lost connection.
        while not info.is_published():
            if self.lost:
                raise PeerGone(self.lost)
            left = remaining(deadline)
            if left == 0.0:
                raise TransportTimeout("the broker did not acknowledge the message in time")
            info.wait_for_publish(1.0 if left is None else min(left, 1.0))

    def close(self, graceful: bool = True) -> None:
        """Disconnect (``graceful``: the broker discards the will) and stop the network thread."""
        with self._cond:
            self._closing = True
        if graceful:
            self._client.disconnect()
        else:  # the connection just dies, as when the process is killed: the will goes out
            sock = self._client.socket()
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._client.loop_stop()  # the network thread closes the socket as it ends


class _Reassembly:
    """Chunks in, whole messages out, per sender; notes when each message's first chunk came."""

    def __init__(self, limits: Limits, timeout: float) -> None:
        most = PREFIX_SIZE + limits.max_header_bytes + limits.max_message_bytes
        self._chunks = ChunkReassembler(max_message_bytes=most, timeout=timeout)
        self._first: dict[tuple[str, int], float] = {}

    def feed(self, payload: bytes, source: str) -> tuple[np.ndarray, float] | None:
        """Add a chunk from ``source``; return ``(message bytes, first chunk's perf_counter)``
        when it completes a message. Raises ``WireError`` for a bad chunk."""
        now = time.perf_counter()
        for lost in self._chunks.expire(now):
            self._first.pop((lost.source, lost.message_id), None)
            log.warning(
                "mqtt: gave up on a message from %r: %d byte ranges never came",
                lost.source,
                len(lost.missing),
            )
        key = (source, parse_chunk(payload)[0].message_id)
        first = self._first.setdefault(key, now)
        try:
            buf = self._chunks.feed(payload, now, source)
        except WireError:
            self._first.pop(key, None)
            raise
        if buf is None:
            return None
        del self._first[key]
        return buf, first


def _check_client_id(client_id: str) -> str:
    if not client_id or any(c in client_id for c in "/+#\0"):
        raise TransportError(
            f"client id {client_id!r} cannot be an MQTT topic level: no '/', '+', '#' or NUL"
        )
    return client_id


class MqttHub(Hub):
    """Hub on the topics under an ``mqtt://host:port/prefix`` URL's prefix (see the module doc).

    ``qos`` and ``chunk_bytes`` override the URL's query; ``timeout`` bounds reaching the broker.
    """

    protocol = "mqtt"

    def __init__(
        self,
        url: str,
        *,
        qos: int | None = None,
        chunk_bytes: int | None = None,
        timeout: float = 10.0,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.settings = s = MqttSettings.from_url(url, qos, chunk_bytes)
        self.url = url
        self._sessions: dict[str, str] = {}  # client id -> the session it said hello with
        self._reassembly = _Reassembly(self.limits, REASSEMBLY_TIMEOUT_S[s.qos])
        self._up = s.up("")
        # Whole messages are decoded and handled off the network thread, so that a callback
        # (on_join, say) may send, which needs that thread to take the broker's PUBACKs.
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(
            target=self._work_loop, name="tensorwire-mqtt-hub", daemon=True
        )
        self._worker.start()
        self._link = _Link(
            s,
            will=(s.ctl(), _control("bye", {"reason": "the hub's connection died"})),
            on_message=self._on_message,
            on_lost=self._on_lost,
        )
        deadline = deadline_after(timeout)
        try:
            self._link.connect(deadline, timeout)
            try:
                self._link.subscribe([s.up("+")], deadline)
            except TransportError:
                self._link.close()
                raise
        except TransportError:
            self._work.put(None)
            raise

    # -- network thread ---------------------------------------------------------------

    def _on_message(self, topic: str, payload: bytes) -> None:
        cid = topic[len(self._up) :]
        try:
            done = self._reassembly.feed(payload, cid)
        except WireError as exc:
            self._rejected(cid, exc)
            return
        if done is not None:
            self._work.put(functools.partial(self._handle, cid, *done))

    def _on_lost(self, reason: str) -> None:
        self._work.put(functools.partial(self._forget_all, f"the hub {reason}"))

    # -- worker thread ----------------------------------------------------------------

    def _work_loop(self) -> None:
        while (job := self._work.get()) is not None:
            job()

    def _handle(self, cid: str, buf: np.ndarray, first_byte_at: float) -> None:
        try:
            msg = self._decode_whole(buf, first_byte_at)
        except WireError as exc:
            self._rejected(cid, exc)
            return
        if msg.kind == "data":
            if cid in self._sessions:
                self._delivered(cid, msg)
            else:
                log.warning("mqtt: dropped a message from %r, which has not said hello", cid)
        elif msg.kind == "hello":
            self._hello(cid, msg)
        elif msg.kind == "bye":
            if cid in self._sessions and msg.meta.get("session") == self._sessions[cid]:
                del self._sessions[cid]
                self._left(cid, str(msg.meta.get("reason", "said goodbye")))
        else:
            log.debug("mqtt: ignoring %r message from %r", msg.kind, cid)

    def _hello(self, cid: str, msg: Message) -> None:
        meta = msg.meta
        decoders, session = meta.get("decoders"), meta.get("session")
        if (
            meta.get("client_id") != cid
            or not isinstance(session, str)
            or not isinstance(decoders, list)
            or not all(isinstance(d, str) for d in decoders)
        ):
            log.warning("mqtt: refused a hello on %s: wrong client_id, session or decoders", cid)
            return
        welcome = {"decoders": self.decoders, "version": PROTOCOL_VERSION, "session": session}
        self._link.publish_nowait(self.settings.ctl(cid), _control("welcome", welcome))
        if self._sessions.get(cid) != session:  # not a repeated hello
            self._sessions[cid] = session
            self._joined(cid, frozenset(decoders))

    def _forget_all(self, reason: str) -> None:
        for cid in list(self._sessions):
            del self._sessions[cid]
            self._left(cid, reason)

    # -- caller's thread --------------------------------------------------------------

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        if client_id not in self._sessions:
            raise PeerGone(f"client {client_id!r} is not connected")
        self._link.publish(self.settings.down(client_id), enc, deadline)

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """One publish on the broadcast topic when every client gets this encoding."""
        if set(clients) != set(self.clients):
            return super()._send_many(clients, enc, deadline)
        t = time.perf_counter()
        try:
            self._link.publish(self.settings.down(), enc, deadline)
        except TransportError as exc:
            return dict.fromkeys(clients, exc)
        return dict.fromkeys(clients, time.perf_counter() - t)

    def _close_transport(self) -> None:
        with contextlib.suppress(TransportError):
            bye = _control("bye", {"reason": "the hub closed"})
            self._link.publish_chunks(self.settings.ctl(), [bye], deadline_after(BYE_TIMEOUT))
        self._link.close()
        self._work.put(None)
        self._worker.join(timeout=5)


class MqttChannel(Channel):
    """A client of an :class:`MqttHub`; waits up to ``timeout`` seconds for broker and hub."""

    protocol = "mqtt"

    def __init__(
        self,
        url: str,
        *,
        client_id: str | None = None,
        codec: Any = "auto",
        checksum: bool = True,
        limits: Limits = Limits(),
        timeout: float = 30.0,
        qos: int | None = None,
        chunk_bytes: int | None = None,
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self.settings = MqttSettings.from_url(url, qos, chunk_bytes)
        self.client_id = _check_client_id(
            client_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        )
        self._cond = threading.Condition()
        self._closed = True
        self.reconnect(timeout)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)connect to the broker, subscribe, and say hello until the hub welcomes us."""
        if not self._closed:
            self._drop()
        s, cid = self.settings, self.client_id
        deadline = deadline_after(timeout)
        self._session = uuid.uuid4().hex[:16]
        self._inbox: collections.deque[Any] = collections.deque()
        self._reassembly = _Reassembly(self.limits, REASSEMBLY_TIMEOUT_S[s.qos])
        self._welcome: Message | None = None
        self._lost: str | None = None
        self._link = _Link(
            s,
            will=(
                s.up(cid),
                _control("bye", {"session": self._session, "reason": "connection lost"}),
            ),
            on_message=self._on_message,
            on_lost=self._on_lost,
        )
        self._link.connect(deadline, timeout)
        try:
            self._link.subscribe([s.down(), s.down(cid), s.ctl(), s.ctl(cid)], deadline)
            welcome = self._say_hello(deadline, timeout)
        except TransportError:
            self._link.close()
            raise
        self.hub_decoders = frozenset(welcome.meta.get("decoders", []))
        self._closed = False

    def _say_hello(self, deadline: float | None, timeout: float) -> Message:
        """Say hello (again, while unanswered) until the hub's welcome; return the welcome."""
        hello = _control(
            "hello",
            {
                "client_id": self.client_id,
                "decoders": self.decoders,
                "version": PROTOCOL_VERSION,
                "session": self._session,
            },
        )
        wait = HELLO_RETRY_S[0]
        while True:
            self._link.publish_nowait(self.settings.up(self.client_id), hello)
            left = remaining(deadline)
            with self._cond:
                self._cond.wait_for(
                    lambda: self._welcome is not None or self._lost is not None,
                    wait if left is None else min(wait, left),
                )
                if self._welcome is not None:
                    return self._welcome
                if self._lost:
                    raise PeerGone(self._lost)
            if remaining(deadline) == 0.0:
                raise TransportTimeout(
                    f"no hub welcomed {self.client_id!r} at {self.url} within {timeout} s "
                    "(is the hub running, on the same broker and prefix?)"
                )
            wait = min(wait * 2, HELLO_RETRY_S[1])

    # -- network thread ---------------------------------------------------------------

    def _on_message(self, topic: str, payload: bytes) -> None:
        try:
            done = self._reassembly.feed(payload, "hub")
        except WireError as exc:
            log.warning(
                "mqtt: %r dropped bytes on %s that are no message chunk: %s",
                self.client_id,
                topic,
                exc,
            )
            return
        if done is None:
            return
        if topic.startswith(self.settings.down()):
            with self._cond:
                self._inbox.append(done)
                self._cond.notify_all()
            return
        try:
            msg = self._decode_whole(*done)
        except WireError as exc:
            log.warning(
                "mqtt: %r dropped a bad control message on %s: %s", self.client_id, topic, exc
            )
            return
        with self._cond:
            if msg.kind == "welcome" and msg.meta.get("session") == self._session:
                self._welcome = msg
            elif msg.kind == "bye":
                self._inbox.append(_HUB_BYE)
            self._cond.notify_all()

    def _on_lost(self, reason: str) -> None:
        with self._cond:
            self._lost = reason
            self._cond.notify_all()

    # -- caller's thread --------------------------------------------------------------

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        self._link.publish(self.settings.up(self.client_id), enc, deadline)

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        while True:
            with self._cond:
                while not self._inbox:
                    if self._closed:
                        raise PeerGone("channel is closed; call reconnect()")
                    if self._lost:
                        raise PeerGone(self._lost)
                    left = remaining(deadline)
                    if left == 0.0:
                        raise TransportTimeout("no message from the hub in time")
                    self._cond.wait(left)
                item = self._inbox.popleft()
            if item is _HUB_BYE:
                self._closed = True
                self._link.close()  # no goodbye: nobody is left to hear it
                raise PeerGone(f"hub at {self.url} closed the session")
            msg = self._decode_whole(*item, out=out)
            if msg.kind == "data":
                return msg

    def _drop(self) -> None:
        """End the connection as if the network died: no goodbye, the broker sends our will."""
        self._closed = True
        self._link.close(graceful=False)

    def close(self) -> None:
        """Say goodbye to the hub and disconnect."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(TransportError):
            bye = _control("bye", {"session": self._session, "reason": "said goodbye"})
            self._link.publish_chunks(
                self.settings.up(self.client_id), [bye], deadline_after(BYE_TIMEOUT)
            )
        self._link.close()
        with self._cond:
            self._cond.notify_all()
