"""``mqtt://[user:pass@]host:port/prefix?qos=1&chunk=1048576``: tensors through an MQTT 5 broker
(``mqtts://``, or ``tls=``: over TLS to the broker).

``docs/transports/mqtt.md`` specifies the mapping. Every payload published is one chunk
(``tensorwire.wire.iter_chunks``) of a tensorwire message, cut under the broker's maximum
packet size, on these topics under ``prefix`` (``<session>`` is the session id of the client's
hello, ``<hub>`` the hub's id, which its welcome names):

- ``prefix/up/<client>/<session>``: the client's hello, data and bye, and its will (a ``bye``
  with ``will: true`` that the broker publishes when the client's connection dies);
- ``prefix/ctl/<client>/<session>``: the hub's welcome or refuse;
- ``prefix/down/<client>/<session>``: the hub's messages to one client;
- ``prefix/down``: broadcasts (the broker's fan-out: one publish reaches every client);
- ``prefix/hub/<hub>``: the hub's bye, and its will.

The session (``docs/session.md``) runs on :class:`HubSession` and :class:`ClientSession`. A
client subscribes before it says hello and repeats the hello until welcomed, so neither start
order nor a late hub loses a message. Sessions are named in the topics: a stale will or a
stranger's bye cannot end a newer session, and the hub reads a topic with no open session under
the small hello limits, taking nothing from it but a hello.

Both sides keep themselves connected: paho reconnects with backoff, the MQTT session (clean
start off, an expiry) keeps subscriptions and queued messages on a broker that keeps them, and
publishes the broker had not acknowledged are sent again (a receiver drops a repeated message
id). A will does not end a session at once: the peer has ``WILL_GRACE_S`` seconds of connected
time to say hello again, because Mosquitto sends every will when it shuts down.

Publishing waits for the broker's acknowledgement of each chunk (PUBACK at QoS 1, PUBCOMP at
QoS 2; the socket write at QoS 0), a window of them in flight, so a send returns when the broker
holds the whole message. Each paho client runs its network loop in its own thread.

Security: TLS protects each link to the broker, the broker's user name and password admit the
link, and the session's hello proves the device's secret to the hub. Any other user of the
broker can still publish on these topics, so a session with a key seals every payload after the
welcome with a MAC trailer (``security.seal``; one entry per member on a broadcast) that the
receiver checks before it reassembles anything; a client's will, and a bye before its welcome,
are sealed with a key both sides derive from the secret and the session id (``_will_key``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import hmac
import itertools
import logging
import queue
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tensorwire.codecs import get_codec
from tensorwire.errors import (
    AuthenticationError,
    DeliveryUncertain,
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
    _log_limited,
    deadline_after,
    default_client_id,
    dial,
    remaining,
)
from tensorwire.transports.security import (
    TLS,
    Keys,
    ReplayWindow,
    Sealer,
    unseal,
)
from tensorwire.transports.session import (
    HELLO_LIMITS,
    Closed,
    Data,
    Hello,
    HubSession,
    Joined,
    State,
    Welcomed,
    bye,
)
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import (
    CHUNK_HEADER_SIZE,
    PREFIX_SIZE,
    ChunkReassembler,
    EncodedMessage,
    Limits,
    Message,
    PartialMessage,
    decode_message,
    encode_message,
    iter_chunks,
    new_message_id,
    parse_chunk,
)

log = logging.getLogger("tensorwire.transports.mqtt")

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883  # mqtts://, or tls= without a port in the URL
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
HANDSHAKE_TIMEOUT_S = 10.0  # a chunked message on a topic with no open session, likewise
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before disconnecting anyway
HELLO_RETRY_S = (0.2, 2.0)  # first and longest wait for a welcome before saying hello again
RECONNECT_DELAY_S = (0.1, 2.0)  # first and longest wait between attempts to reach the broker
# Seconds the broker keeps a disconnected link's session (subscriptions, queued messages).
# Longer rides out longer outages, but the broker queues a vanished client's messages as long.
SESSION_EXPIRY_S = 300
MAX_OUTAGE_S = SESSION_EXPIRY_S  # a send without deadline gives up on a broker gone this long
# Seconds of connected time a peer whose will came has to say hello (or answer one) again:
# Mosquitto publishes every will when it shuts down, so a restart must not end the sessions.
# Covers the longest reconnect backoff plus a hello's round trip, with room for a busy host.
WILL_GRACE_S = 8.0
TICK_S = 0.5  # how often partial messages are expired and graces checked
# Bytes of the hub's payloads a client with a secret holds before the welcome that lets it check
# them (data sent from on_join may overtake the welcome: MQTT orders one topic, not two).
EARLY_BYTES = 64 << 20
_CONTROL_BYTES = PREFIX_SIZE + HELLO_LIMITS.max_header_bytes + HELLO_LIMITS.max_message_bytes
_NO_ENTRY = (134, 135)  # CONNACK reasons "bad user name or password", "not authorized"
_HUB = b"hub"  # the sender the hub's MACs name (docs/security.md)
_WILL_LABEL = b"tensorwire mqtt will key v2"


def _redacted(url: str) -> str:
    """``url`` with its password (if it names one) shown as ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


@dataclass(frozen=True)
class MqttSettings:
    """What an ``mqtt://`` URL names: broker address, credentials, topic prefix, QoS, chunk
    size, and whether the link runs TLS (``mqtts://``)."""

    host: str
    port: int
    username: str | None
    password: str | None
    prefix: str
    qos: int
    chunk_bytes: int  # most bytes per published payload, chunk header included
    tls: bool = False

    @classmethod
    def from_url(
        cls, url: str, qos: int | None = None, chunk_bytes: int | None = None, tls: bool = False
    ) -> MqttSettings:
        """Read ``url``; ``qos`` / ``chunk_bytes``, when given, override its query; ``tls``
        (TLS settings were given) makes an ``mqtt://`` URL's link TLS too."""
        parts = urlsplit(url)
        url = _redacted(url)  # for messages: the password stays out of them
        if parts.scheme not in ("mqtt", "mqtts"):
            raise TransportError(f"{url!r} is not an mqtt:// or mqtts:// URL")
        tls = tls or parts.scheme == "mqtts"
        host, port = host_port(url, default_port=DEFAULT_TLS_PORT if tls else DEFAULT_PORT)
        query = query_options(url, ("qos", "chunk"))
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
            tls=tls,
        )

    def up(self, client_id: str, session: str) -> str:
        """Client to hub: hello, data, bye and the client's will."""
        return f"{self.prefix}/up/{client_id}/{session}"

    def ctl(self, client_id: str, session: str) -> str:
        """Hub to one session: welcome or refuse."""
        return f"{self.prefix}/ctl/{client_id}/{session}"

    def down(self, client_id: str | None = None, session: str | None = None) -> str:
        """Hub to one session's client; without arguments, the broadcast topic."""
        if client_id is None or session is None:
            return f"{self.prefix}/down"
        return f"{self.prefix}/down/{client_id}/{session}"

    def hub(self, hub_id: str = "+") -> str:
        """The hub's bye and will; ``+`` (the default) is every hub's, for subscribing."""
        return f"{self.prefix}/hub/{hub_id}"


def _one_chunk(enc: EncodedMessage) -> bytes:
    """A small message as the one chunk that carries it, under a fresh message id (a receiver
    drops a chunk whose id it has completed, so each publish of a control message needs one)."""
    return b"".join(next(iter_chunks(enc.frames(), new_message_id(), max(enc.nbytes, 1))))


def _sealed_chunk(enc: EncodedMessage, sealer: Sealer | None) -> bytes:
    """A small message as one chunk (:func:`_one_chunk`), sealed when there is a sealer."""
    chunk = _one_chunk(enc)
    return chunk if sealer is None else chunk + sealer([chunk])


def _unsealed(
    payload: bytes, key: bytes, sender: bytes, window: ReplayWindow, dup: bool
) -> memoryview | None:
    """The chunk a sealed payload from ``sender`` carries, once its MAC and sequence number
    are checked; :class:`AuthenticationError` if it is missing, forged, altered or replayed.

    None for a duplicate delivery: the broker sends a payload again with the DUP flag when
    our acknowledgement may have been lost, which no other user of the broker can make it do,
    so an authentic payload seen before that comes so is dropped silently, not as an attack.
    """
    view = memoryview(payload)
    try:
        return unseal(view, key, sender, window)
    except AuthenticationError as exc:
        if dup:
            with contextlib.suppress(AuthenticationError):
                unseal(view, key, sender, ReplayWindow())  # authentic, so refused as a repeat
                return None
        raise exc


def _will_key(secret: bytes, client_id: str, session: str) -> bytes:
    """The key of a session's wills and of a client's bye before its welcome (32 bytes): both
    sides derive it from the client's secret and the session id, which the will needs at
    CONNECT, before the hub's nonce and with it the session key exist."""
    message = b"\0".join([_WILL_LABEL, client_id.encode(), session.encode()])
    return hmac.new(secret, message, hashlib.sha256).digest()


def _repeats(payload: bytes, message: bytes) -> bool:
    """Whether ``payload`` is the whole of ``message`` in one chunk, under any message id."""
    if not message or len(payload) != CHUNK_HEADER_SIZE + len(message):
        return False
    try:
        head, body = parse_chunk(payload)
    except WireError:
        return False
    return head.count == 1 and body == message


class _ServerNamed:
    """An SSL context that checks the broker's certificate for ``name`` (``TLS.server_name``)
    rather than for the host paho dials, which paho passes to ``wrap_socket``."""

    def __init__(self, context: ssl.SSLContext, name: str) -> None:
        self._context = context
        self._name = name

    @property
    def check_hostname(self) -> bool:
        return self._context.check_hostname

    def wrap_socket(self, sock: socket.socket, server_hostname: Any = None, **kw: Any) -> Any:
        return self._context.wrap_socket(sock, server_hostname=self._name, **kw)


def _link_tls(settings: MqttSettings, tls: TLS | None) -> TLS | None:
    """The TLS a link runs: the settings given, else the system's CAs for an ``mqtts`` URL."""
    return tls if tls is not None or not settings.tls else TLS()


def _will(reason: str) -> EncodedMessage:
    """The ``bye`` the broker publishes for us when our connection dies unannounced."""
    return encode_message(None, {"reason": reason, "will": True}, kind="bye")


def _is_will(msg: Message) -> bool:
    return msg.kind == "bye" and msg.meta.get("will") is True


def _no_delay(_client: Any, _userdata: Any, sock: Any) -> None:
    # paho leaves Nagle on: a small publish or PUBACK then waits ~40 ms for a delayed ACK.
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _run_safely(job: Callable[[], None], where: str) -> None:
    """Run ``job``; a bug in it is logged and does not end the thread that runs it."""
    try:
        job()
    except Exception:
        log.exception("mqtt: %s failed", where)


def _lost_message(what: str, lost: PartialMessage) -> None:
    missing = sum(n for _, n in lost.missing)
    _log_limited(
        f"mqtt lost {what} {lost.source}",
        f"mqtt: {what} gave up on a message on {lost.source}: {missing} of its "
        f"{lost.total_length} bytes ({len(lost.missing)} ranges) never came",
    )


class _Chunks:
    """Chunks in, whole messages out: a :class:`ChunkReassembler` keyed by topic that notes when
    each message's first chunk came (``time.perf_counter()``, for transfer records).

    Fed from the network thread and expired from a worker, hence the lock.
    """

    def __init__(self, max_message_bytes: int, timeout: float) -> None:
        self._chunks = ChunkReassembler(max_message_bytes=max_message_bytes, timeout=timeout)
        # (topic, message id) of the pending ones: when their first chunk came
        self._first: dict[tuple[Hashable, int], float] = {}
        self._lock = threading.Lock()

    def feed(self, payload: bytes, topic: str) -> tuple[np.ndarray, float] | None:
        """Add a chunk; ``(message bytes, first chunk's time)`` when it completes a message.
        Raises ``WireError`` for a chunk that is malformed, inconsistent or over the limit."""
        now = time.perf_counter()
        head = parse_chunk(payload)[0]
        key = (topic, head.message_id)
        with self._lock:
            buf = self._chunks.feed(payload, now, topic)
            if buf is not None:
                return buf, self._first.pop(key, now)
            if key not in self._first and self._chunks.is_pending(head.message_id, topic):
                self._first[key] = now
        return None

    def expire(self) -> list[PartialMessage]:
        """The messages given up on (no chunk for the timeout, or evicted to make room)."""
        with self._lock:
            lost = self._chunks.expire(time.perf_counter())
            for p in lost:
                self._first.pop((p.source, p.message_id), None)
        return lost


class _Link:
    """One paho client on its own network thread that stays connected for as long as it lives.

    It keeps one MQTT session (clean start off, ``SESSION_EXPIRY_S``): after a loss paho
    reconnects with backoff and sends again what the broker had not acknowledged, and if the
    broker lost the session the link subscribes again. ``tls`` makes it TLS to the broker.
    ``will()`` gives the topic and payload of the will for each connection.
    ``on_message(topic, payload, dup)`` (``dup``: the broker's redelivery), ``on_lost(detail)``
    and ``on_back(detail, kept)`` (``kept``: the broker still had our session) are called from
    the network thread and must not wait on it.
    """

    def __init__(
        self,
        settings: MqttSettings,
        *,
        tls: TLS | None,
        will: Callable[[], tuple[str, bytes]],
        subscriptions: Sequence[str],
        on_message: Callable[[str, bytes, bool], None],
        on_lost: Callable[[str], None],
        on_back: Callable[[str, bool], None],
    ) -> None:
        self.settings = settings
        self.address = f"{settings.host}:{settings.port}"
        self.tls = tls
        self.max_packet = MQTT_MAX_PACKET
        self.up = False  # connected now
        self._will = will
        self._subscriptions = list(subscriptions)
        self._on_message = on_message
        self._on_lost = on_lost
        self._on_back = on_back
        self._cond = threading.Condition()
        self._connack: Any = None  # the first CONNACK's reason code, once it came
        self._unanswered = 0  # connections the broker ended before its first CONNACK
        self._subacks: dict[int, list[Any] | None] = {}  # awaited SUBACKs: None until it came
        self._closing = False
        self._down_since: float | None = None  # monotonic, while the connection is lost
        self._generation = 0  # connections made: a QoS 0 publish is lost with its connection
        self.sessions_lost = 0  # reconnects that found our session gone, and what it held
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"tw-{uuid.uuid4().hex[:20]}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        client.suppress_exceptions = True  # a callback's bug is logged, never ends the thread
        # paho's hints say int seconds; its backoff works in float seconds
        client.reconnect_delay_set(*RECONNECT_DELAY_S)  # type: ignore[arg-type]
        if settings.username is not None:
            client.username_pw_set(settings.username, settings.password)
        if tls is not None:
            context = tls.client_context()
            named = context if tls.server_name is None else _ServerNamed(context, tls.server_name)
            # _ServerNamed has what paho uses of a context: check_hostname and wrap_socket
            client.tls_set_context(named)  # type: ignore[arg-type]
        client.on_socket_open = _no_delay
        client.on_connect = self._connected
        client.on_disconnect = self._disconnected
        client.on_subscribe = self._subscribed
        client.on_message = self._received
        self._client = client
        self._arm_will()

    def _arm_will(self) -> None:
        """Set the will for the next connection (a fresh payload each time)."""
        topic, payload = self._will()
        self._client.will_set(topic, payload, qos=self.settings.qos)

    # -- network thread ---------------------------------------------------------------

    def _received(self, _c: Any, _u: Any, msg: paho.MQTTMessage) -> None:
        _run_safely(
            # a received PUBLISH's payload is bytes (paho unpacks it with struct)
            lambda: self._on_message(msg.topic, cast(bytes, msg.payload), bool(msg.dup)),
            "handling a message",
        )

    def _connected(self, client: Any, _u: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            with self._cond:
                first = self._connack is None
                if first:
                    self._connack = reason
                    self._cond.notify_all()
            if not first:
                log.warning(
                    "mqtt: the broker at %s refused to take us back: %s", self.address, reason
                )
            return
        size = getattr(props, "MaximumPacketSize", None)
        with self._cond:
            first = self._connack is None
            kept = first or bool(flags.session_present)
            if first:
                self._connack = reason
            if size:
                self.max_packet = min(int(size), MQTT_MAX_PACKET)
            self.up = True
            self._down_since = None
            self._generation += 1
            self.sessions_lost += not kept
            self._cond.notify_all()
        if first:
            return
        if not kept:  # queued ahead of the publishes paho sends again after this callback
            client.subscribe([(t, self.settings.qos) for t in self._subscriptions])
        detail = f"back on the broker at {self.address}" + (
            ""
            if kept
            else "; it had lost our session (does it keep none?), so messages to us while it "
            "was down may be lost"
        )
        self._on_back(detail, kept)

    def _disconnected(self, _c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        with self._cond:
            if self._closing:
                return
            was_up, self.up = self.up, False
            self._unanswered += self._connack is None
            if self._down_since is None:
                self._down_since = time.monotonic()
            self._cond.notify_all()
        self._arm_will()  # a second will under the first's id would be dropped as a repeat
        if was_up:
            self._on_lost(f"lost the connection to the broker at {self.address} ({reason})")

    def _subscribed(self, _c: Any, _u: Any, mid: int, codes: list[Any], _props: Any) -> None:
        with self._cond:
            if mid in self._subacks:
                self._subacks[mid] = codes
                self._cond.notify_all()
                return
        refused = [c for c in codes if c.is_failure]
        if refused:
            log.error("mqtt: the broker refused our subscriptions again: %s", refused)

    # -- caller's thread --------------------------------------------------------------

    def connect(self, deadline: float | None, timeout: float | None) -> None:
        """Connect (retrying while nothing listens), wait for the CONNACK, then subscribe."""
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY_S
        s = self.settings

        def attempt(_deadline: float | None) -> Any:
            try:
                # clean_start=False from the first connect: Mosquitto saves no session that
                # began clean; the client id is fresh, so there is nothing stale to resume.
                return self._client.connect(
                    s.host, s.port, KEEPALIVE_S, clean_start=False, properties=props
                )
            except ssl.SSLCertVerificationError as exc:  # final: retrying will not change it
                raise AuthenticationError(
                    f"the broker at {self.address} has a certificate this side does not trust "
                    f"({exc.verify_message}): give tls=TLS(ca=...) the CA that signed it, and "
                    "servername= the name it carries if that is not the URL's host"
                ) from None

        dial(
            attempt,
            what=f"an MQTT broker{' with TLS' if self.tls else ''} at {self.address} (start one: "
            "apt-get install mosquitto, or use tensorwire.transports.brokers.ensure_mosquitto)",
            timeout=remaining(deadline),
        )
        self._client.loop_start()
        try:
            with self._cond:
                self._cond.wait_for(lambda: self._connack is not None, remaining(deadline))
                reason = self._connack
            if reason is None:
                hint = ""
                if self._unanswered:  # as a TLS listener does with MQTT in clear, and back
                    hint = (
                        f": it ended {self._unanswered} connections unanswered (is its port for "
                        f"{'MQTT in clear' if self.tls else 'TLS: use mqtts:// or tls='}?)"
                    )
                raise TransportTimeout(
                    f"the broker at {self.address} did not accept in {timeout} s{hint}"
                )
            if reason.is_failure and reason.value in _NO_ENTRY:
                raise AuthenticationError(
                    f"the broker at {self.address} refused the connection: {reason} (check "
                    "the user and password in the URL)"
                )
            if reason.is_failure:
                raise TransportError(
                    f"the broker at {self.address} refused the connection: {reason}"
                )
            self._subscribe(deadline)
        except BaseException:
            self.close()
            raise

    def _subscribe(self, deadline: float | None) -> None:
        """Subscribe to the link's topics at its QoS and wait until the broker confirms."""
        topics = self._subscriptions
        with self._cond:  # registered before the SUBACK can come
            rc, mid = self._client.subscribe([(t, self.settings.qos) for t in topics])
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                raise PeerGone(f"could not subscribe to {topics}: {paho.error_string(rc)}")
            assert mid is not None  # paho gives a message id with MQTT_ERR_SUCCESS
            self._subacks[mid] = None
            try:  # paho does not repeat a SUBSCRIBE the lost connection took with it
                self._cond.wait_for(
                    lambda: self._subacks[mid] is not None or not self.up, remaining(deadline)
                )
            finally:
                codes = self._subacks.pop(mid)
        if codes is None:
            raise TransportTimeout(
                f"the broker at {self.address} did not confirm subscribing to {topics}"
                + ("" if self.up else ": the connection dropped")
            )
        refused = [t for t, c in zip(topics, codes, strict=True) if c.is_failure]
        if refused:
            raise TransportError(
                f"the broker at {self.address} refused subscriptions to {refused}: {codes}"
            )

    def chunk_payload(self, topic: str, total: int, trailer: int = 0) -> int:
        """Message bytes per chunk on ``topic`` for a message of ``total`` bytes, each payload
        ``trailer`` bytes longer than its chunk (a MAC trailer)."""
        # fixed header 5, topic 2 + len, packet id 2, properties length 1; rounded up
        most = self.max_packet - 16 - len(topic.encode()) - CHUNK_HEADER_SIZE - trailer
        wanted = max(
            self.settings.chunk_bytes - CHUNK_HEADER_SIZE, -(-total // MAX_CHUNKS_PER_MESSAGE)
        )
        if most <= 0:
            raise TransportError(
                f"the broker's maximum packet of {self.max_packet} bytes is too small"
            )
        return min(wanted, most)

    def publish(
        self,
        topic: str,
        enc: EncodedMessage,
        deadline: float | None,
        sealer: Sealer | None = None,
    ) -> None:
        """Publish a message as chunks, each sealed if there is a ``sealer`` (as it goes, so
        sequence numbers follow the publishes); return when the broker acknowledged them all."""
        size = self.chunk_payload(topic, enc.nbytes, 0 if sealer is None else sealer.size)
        self.publish_chunks(
            topic,
            (
                b"".join(parts if sealer is None else [*parts, sealer(parts)])  # paho: bytes only
                for parts in iter_chunks(enc.frames(), new_message_id(), size)
            ),
            deadline,
        )

    def publish_chunks(self, topic: str, payloads: Iterable[bytes], deadline: float | None) -> None:
        """Publish ``payloads`` in order, a window of them unacknowledged; return when acked.

        While the broker is unreachable this waits for it, until ``deadline``
        (:class:`TransportTimeout`) or ``MAX_OUTAGE_S`` of outage (:class:`PeerGone`); what was
        handed over before the outage is sent again when it is back, and may still arrive after
        a timeout (MQTT cannot take a publish back). :class:`TransportError` says the message
        may be lost: at QoS 0 a chunk went with the connection, or the broker came back without
        our session while the message was in flight.
        """
        sessions_lost = self.sessions_lost
        window: collections.deque[tuple[paho.MQTTMessageInfo, int, int]] = collections.deque()
        in_flight = 0
        for payload in payloads:
            info, generation = self._hand_over(topic, payload, deadline)
            window.append((info, generation, len(payload)))
            in_flight += len(payload)
            while in_flight > WINDOW_BYTES:
                info, generation, n = window.popleft()
                self._wait(info, generation, deadline)
                in_flight -= n
        for info, generation, _ in window:
            self._wait(info, generation, deadline)
        if self.sessions_lost != sessions_lost:
            raise DeliveryUncertain(
                f"the broker at {self.address} came back without our session while this message "
                "was in flight (does it keep none?): its subscribers may not have been there"
            )

    def publish_nowait(self, topic: str, payload: bytes) -> None:
        """Queue a small payload without waiting, from any thread: it goes now or, at QoS 1/2,
        when the connection is back (at QoS 0 it is dropped while down, and logged)."""
        info = self._client.publish(topic, payload, qos=self.settings.qos)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS and (
            info.rc != MQTTErrorCode.MQTT_ERR_NO_CONN or not self.settings.qos
        ):
            log.info("mqtt: could not publish on %s: %s", topic, paho.error_string(info.rc))

    def _check_usable(self) -> None:
        """Raise :class:`PeerGone` if the link is closed or the broker gone too long (under
        ``_cond``)."""
        if self._closing:
            raise PeerGone("the connection to the broker is closed")
        if self._down_since is not None and time.monotonic() - self._down_since > MAX_OUTAGE_S:
            raise PeerGone(
                f"the broker at {self.address} has been unreachable for over {MAX_OUTAGE_S} s"
            )

    def _outage(self) -> str:
        since = self._down_since
        return "" if since is None else f" (unreachable for {time.monotonic() - since:.1f} s)"

    def _hand_over(
        self, topic: str, payload: bytes, deadline: float | None
    ) -> tuple[paho.MQTTMessageInfo, int]:
        """Give paho one payload once the broker connection is up; return its info and the
        connection's generation."""
        with self._cond:
            while not self.up:
                self._check_usable()
                left = remaining(deadline)
                if left == 0.0:
                    raise TransportTimeout(
                        f"the broker at {self.address} is unreachable{self._outage()}: not sent"
                    )
                self._cond.wait(1.0 if left is None else min(left, 1.0))  # 1 s: outage limit
            generation = self._generation
        info = self._client.publish(topic, payload, qos=self.settings.qos)
        if info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and self.settings.qos:
            # lost just now: paho keeps it and sends it once reconnected; the rc would make
            # is_published() raise although the PUBACK will mark it published
            info.rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        elif info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise TransportError(f"could not publish on {topic!r}: {paho.error_string(info.rc)}")
        return info, generation

    def _wait(self, info: paho.MQTTMessageInfo, generation: int, deadline: float | None) -> None:
        # paho wakes this on the acknowledgement; the 1 s slices notice a closed link.
        while not info.is_published():
            with self._cond:
                self._check_usable()
                if not self.settings.qos and (self._generation != generation or not self.up):
                    raise TransportError(
                        f"a QoS 0 publish was lost with the connection to {self.address}"
                    )
            left = remaining(deadline)
            if left == 0.0:
                raise TransportTimeout(
                    f"the broker did not acknowledge the message in time{self._outage()}"
                )
            info.wait_for_publish(1.0 if left is None else min(left, 1.0))

    def close(self, graceful: bool = True) -> None:
        """Disconnect and stop the network thread. ``graceful``: the broker ends our session
        and discards the will; otherwise the connection just dies (as when the process is
        killed) and the will goes out."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self.up = False
            self._cond.notify_all()
        if graceful:
            props = Properties(PacketTypes.DISCONNECT)
            props.SessionExpiryInterval = 0
            self._client.disconnect(properties=props)
        else:
            sock = self._client.socket()
            if isinstance(sock, socket.socket):  # a plain or TLS socket: paho's TCP transport
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._client.loop_stop()  # the network thread closes the socket as it ends


def _check_client_id(client_id: str) -> str:
    if not client_id or any(c in client_id for c in "/+#\0"):
        raise TransportError(
            f"client id {client_id!r} cannot be an MQTT topic level: no '/', '+', '#' or NUL"
        )
    return client_id


@dataclass(eq=False)
class _Client:
    """A client's open session on the hub."""

    session: HubSession
    sid: str  # its session id, the last level of its topics
    hello: bytes = b""  # the hello that opened it: a copy of it is answered, not read
    will_key: bytes | None = None  # checks its wills (and a bye before its welcome)
    window: ReplayWindow = field(default_factory=ReplayWindow)  # its sealed payloads' numbers
    will_window: ReplayWindow = field(default_factory=ReplayWindow)  # its wills' numbers
    suspect_until: float | None = None  # monotonic: must say hello again by then (will came)
    why: str = ""  # the reason it leaves with if it does not
    unsure: bool = False  # the broker lost the sessions: subscribed again only once it says hello


class MqttHub(Hub):
    """Hub on the topics under an ``mqtt://host:port/prefix`` URL's prefix (see the module doc).

    ``qos`` and ``chunk_bytes`` override the URL's query; ``timeout`` bounds reaching the broker.
    ``tls`` is the link's TLS to the broker (its ``ca`` checks the broker's certificate; its
    ``cert`` is shown if the broker asks for one); ``auth`` the enrolled devices' keys, which
    admit clients here: the hub never sees a client's certificate, the broker does.
    ``authenticate`` runs on the MQTT network thread: it must not send.
    """

    sees_client_certificates = False  # they reach the broker, never the hub

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
        self.settings = s = MqttSettings.from_url(url, qos, chunk_bytes, tls=self.tls is not None)
        self.url = url
        if self.tls is not None and self.authenticate is None:
            log.warning(
                "mqtt: the hub at %s has TLS settings but no auth= keys: client certificates "
                "reach the broker, never the hub, so it admits ANYONE who can use the broker",
                _redacted(url),
            )
        self.hub_id = uuid.uuid4().hex  # names this hub's topic; its welcomes carry it
        self._seq = itertools.count()  # the sequence numbers of the hub's sealed payloads
        self._lock = threading.Lock()
        self._clients: dict[str, _Client] = {}  # open sessions, by client id
        self._back = threading.Condition(self._lock)  # a client was sure again, or left
        self._medium_up = True
        most = PREFIX_SIZE + self.limits.max_header_bytes + self.limits.max_message_bytes
        self._member_chunks = _Chunks(most, REASSEMBLY_TIMEOUT_S[s.qos])
        self._stranger_chunks = _Chunks(_CONTROL_BYTES, HANDSHAKE_TIMEOUT_S)
        self._up_prefix = f"{s.prefix}/up/"
        # Whole messages are decoded and handled off the network thread, so that a callback
        # (on_join, say) may send, which needs that thread to take the broker's PUBACKs.
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(
            target=self._work_loop, name="tensorwire-mqtt-hub", daemon=True
        )
        self._worker.start()
        hub_will = (s.hub(self.hub_id), _will("the hub's connection died"))
        self._link = _Link(
            s,
            tls=_link_tls(s, self.tls),
            # unsealed (no member is known at CONNECT): it only makes clients ask
            will=lambda: (hub_will[0], _one_chunk(hub_will[1])),
            subscriptions=[s.up("+", "+")],
            on_message=self._on_message,
            on_lost=lambda detail: self._work.put(functools.partial(self._medium_lost, detail)),
            on_back=lambda detail, kept: self._work.put(
                functools.partial(self._medium_back, detail, kept)
            ),
        )
        try:
            self._link.connect(deadline_after(timeout), timeout)
        except BaseException:
            self._work.put(None)
            raise

    # -- network thread ---------------------------------------------------------------

    def _on_message(self, topic: str, payload: bytes, dup: bool) -> None:
        cid, _, sid = topic[len(self._up_prefix) :].partition("/")
        with self._lock:
            client = self._clients.get(cid)
        if client is not None and client.sid == sid:
            self._from_member(cid, client, topic, payload, dup)
            return
        try:  # no open session here: a hello, or a stranger's, read under the hello limits
            done = self._stranger_chunks.feed(payload, topic)
            if done is None:
                return
            msg = decode_message(done[0], limits=HELLO_LIMITS, codec_lookup=get_codec)
        except WireError as exc:
            self._rejected(cid, exc)
            return
        if msg.kind == "hello":
            self._open(cid, sid, msg, done[0].tobytes())
        elif msg.kind == "bye":
            log.debug("mqtt: a bye for %r's session %s, which is not open", cid, sid)
        else:
            self._rejected(
                cid, SessionRefused(f"a {msg.kind!r} message on {topic}: say hello first")
            )

    def _from_member(
        self, cid: str, client: _Client, topic: str, payload: bytes, dup: bool
    ) -> None:
        """A payload on an open session's uplink: with a key, checked before it is reassembled."""
        chunk: Any = payload
        if client.session.key is not None:
            if _repeats(payload, client.hello):
                # the opening hello again, unsealed: from a client still waiting for the
                # welcome, or a copy someone replays, so it earns the welcome and nothing more
                self._work.put(functools.partial(self._welcome, cid, client, False))
                return
            try:
                chunk = self._checked(cid, client, payload, dup)
            except AuthenticationError as exc:
                self._rejected(cid, exc)
                return
            if chunk is None:
                log.debug("mqtt: dropped a duplicate delivery from %r", cid)
                return
        try:
            done = self._member_chunks.feed(chunk, topic)
        except WireError as exc:
            self._rejected(cid, exc)
            return
        if done is not None:
            self._work.put(functools.partial(self._handle, cid, client, *done))

    @staticmethod
    def _checked(cid: str, client: _Client, payload: bytes, dup: bool) -> memoryview | None:
        """The chunk of a payload sealed with the session key, or with the will key (a will, a
        bye before the welcome); None for a duplicate delivery."""
        key = client.session.key
        assert key is not None
        try:
            return _unsealed(payload, key, cid.encode(), client.window, dup)
        except AuthenticationError:
            if client.will_key is None:
                raise
            # a payload sealed for another key has no entry for this one: cheap to rule out
            with contextlib.suppress(AuthenticationError):
                return _unsealed(payload, client.will_key, cid.encode(), client.will_window, dup)
            raise

    def _open(self, cid: str, sid: str, msg: Message, hello_bytes: bytes) -> None:
        """A hello on a topic with no open session: open one (a new client, or a client's newer
        session), or refuse it. ``hello_bytes``: the hello as it came."""
        session = HubSession(**self._session_options(), welcome_meta={"hub": self.hub_id})
        try:
            joined = session.receive(msg)
            assert isinstance(joined, Joined)  # in its first state a session joins or raises
            hello = joined.hello
            if (hello.client_id, hello.session) != (cid, sid):
                raise SessionRefused(
                    f"a hello on the topics of client {cid!r}, session {sid!r} must name both"
                )
        except SessionRefused as exc:
            self._link.publish_nowait(self.settings.ctl(cid, sid), _one_chunk(session.refusal(exc)))
            self._work.put(functools.partial(self._refused, cid, exc))
            return
        client = _Client(session, sid, hello_bytes, self._will_key_of(hello, session))
        with self._lock:  # from now on this session's chunks are a member's
            self._clients[cid] = client
        self._work.put(functools.partial(self._admit, cid, client))

    def _will_key_of(self, hello: Hello, session: HubSession) -> bytes | None:
        """The session's will key, when it has a session key and the hub the client's secret."""
        keys = getattr(self.authenticate, "keys", None)
        if session.key is None or not isinstance(keys, Keys):
            return None
        secret = keys.get(hello.client_id)
        return None if secret is None else _will_key(secret, hello.client_id, hello.session)

    # -- worker thread ----------------------------------------------------------------

    def _work_loop(self) -> None:
        next_tick = 0.0
        while True:
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + TICK_S
                _run_safely(self._tick, "the hub's tick")
            try:
                job = self._work.get(timeout=max(next_tick - time.monotonic(), 0.001))
            except queue.Empty:
                continue
            if job is None:
                return
            _run_safely(job, "the hub's worker")

    def _current(self, cid: str, client: _Client) -> bool:
        with self._lock:
            return self._clients.get(cid) is client

    def _admit(self, cid: str, client: _Client) -> None:
        hello = client.session.hello
        if hello is None or not self._current(cid, client):
            return  # replaced before it was admitted
        self._joined(cid, hello.decoders, session=client, max_message_bytes=hello.max_message_bytes)
        self._welcome(cid, client, sealed=False)

    def _welcome(self, cid: str, client: _Client, sealed: bool) -> None:
        """Publish the session's welcome, ``sealed`` (answering a sealed hello: the client has
        the key) or not (the first, or answering the unsealed hello of a client without it)."""
        key = client.session.key
        sealer = self._sealer([key]) if sealed and key is not None else None
        self._link.publish_nowait(
            self.settings.ctl(cid, client.sid), _sealed_chunk(client.session.welcome(), sealer)
        )

    def _sealer(self, keys: list[bytes]) -> Sealer | None:
        """What seals the hub's payloads for sessions with these keys; None for none."""
        return Sealer(keys, _HUB, self._seq) if keys else None

    def _handle(self, cid: str, client: _Client, buf: np.ndarray, first_byte_at: float) -> None:
        """A whole message from a member's session, in the order its chunks came."""
        if not self._current(cid, client):
            log.info("mqtt: dropped a message of %r's session %s, which ended", cid, client.sid)
            return
        try:
            msg = self._decode_whole(buf, first_byte_at)
        except WireError as exc:
            self._rejected(cid, exc)
            return
        if msg.kind == "hello":  # asked again (sealed, with a key): reconnected, or probes us
            client.session.receive(msg)
            with self._back:  # it subscribed before it said hello: sends to it may go now
                client.suspect_until, client.unsure = None, False
                self._back.notify_all()
            self._welcome(cid, client, sealed=True)
            return
        if _is_will(msg):
            log.info(
                "mqtt: client %r: its connection died; it has %s s to come back", cid, WILL_GRACE_S
            )
            client.suspect_until = time.monotonic() + WILL_GRACE_S
            client.why = "connection lost"
            return
        event = client.session.receive(msg)
        if isinstance(event, Data):
            self._delivered(cid, msg)
        elif isinstance(event, Closed):
            self._drop_client(cid, client, event.reason)
        else:
            log.debug("mqtt: %r: %s", cid, event)

    def _drop_client(self, cid: str, client: _Client, reason: str) -> None:
        with self._back:
            if self._clients.get(cid) is client:
                del self._clients[cid]
                self._back.notify_all()
        self._left(cid, reason, session=client)

    def _medium_lost(self, detail: str) -> None:
        with self._lock:
            self._medium_up = False
        log.warning("mqtt: the hub %s; its clients stay members while it reconnects", detail)
        self._event("medium-lost", None, detail)

    def _medium_back(self, detail: str, kept: bool) -> None:
        """Graces restart now; if the broker lost the sessions (and with them the wills of
        clients that died meanwhile), every client must say hello again within one."""
        until = time.monotonic() + WILL_GRACE_S
        with self._lock:
            self._medium_up = True
            for client in self._clients.values():
                if not kept:
                    client.why = "did not come back after the broker lost its sessions"
                    client.unsure = True
                if not kept or client.suspect_until is not None:
                    client.suspect_until = until
        log.warning("mqtt: the hub is %s", detail)
        self._event("medium-back", None, detail)

    def _tick(self) -> None:
        for lost in self._member_chunks.expire():
            _lost_message("the hub", lost)
        for lost in self._stranger_chunks.expire():
            log.debug("mqtt: gave up on a stranger's message: %r", lost)
        now = time.monotonic()
        with self._lock:
            if not self._medium_up:
                return  # a grace counts connected time only
            gone = [
                (cid, c)
                for cid, c in self._clients.items()
                if c.suspect_until is not None and c.suspect_until <= now
            ]
        for cid, client in gone:
            self._drop_client(cid, client, client.why)

    # -- caller's thread --------------------------------------------------------------

    def _await_back(self, cids: list[str], deadline: float | None) -> dict[str, Exception]:
        """Wait until none of ``cids`` is unsure (a message to it now could find it not yet
        subscribed again); return the error of each that left, or is still unsure at
        ``deadline`` (without one, after ``MAX_OUTAGE_S``)."""
        give_up = deadline_after(MAX_OUTAGE_S) if deadline is None else deadline
        with self._back:
            self._back.wait_for(
                lambda: (
                    not any((c := self._clients.get(cid)) is not None and c.unsure for cid in cids)
                ),
                remaining(give_up),
            )
            failed: dict[str, Exception] = {}
            for cid in cids:
                client = self._clients.get(cid)
                if client is None:
                    failed[cid] = PeerGone(f"client {cid!r} is not connected")
                elif client.unsure:
                    failed[cid] = TransportTimeout(
                        f"client {cid!r} has not come back since the broker lost its sessions"
                    )
            return failed

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        failed = self._await_back([client_id], deadline)
        if failed:
            raise failed[client_id]
        with self._lock:
            client = self._clients.get(client_id)
        if client is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        key = client.session.key
        sealer = self._sealer([] if key is None else [key])
        self._link.publish(self.settings.down(client_id, client.sid), enc, deadline, sealer)

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """One publish on the broadcast topic when every client gets this encoding, sealed with
        each one's key (if some sessions have a key and others none, one publish each)."""
        if set(clients) != set(self.clients):
            return super()._send_many(clients, enc, deadline)
        results: dict[str, float | Exception] = dict(self._await_back(clients, deadline))
        reached = [c for c in clients if c not in results]
        if not reached:
            return results
        keys = self._keys(reached)
        if 0 < len(keys) < len(reached):
            return {**results, **super()._send_many(reached, enc, deadline)}
        t = time.perf_counter()
        try:
            self._link.publish(self.settings.down(), enc, deadline, self._sealer(keys))
        except TransportError as exc:
            return {**results, **dict.fromkeys(reached, exc)}
        return {**results, **dict.fromkeys(reached, time.perf_counter() - t)}

    def _keys(self, clients: Iterable[str]) -> list[bytes]:
        """The session keys of those of ``clients`` that have one."""
        with self._lock:
            sessions = [self._clients.get(c) for c in clients]
        return [c.session.key for c in sessions if c is not None and c.session.key is not None]

    def _close_transport(self) -> None:
        with self._lock:
            members = list(self._clients)
        keys = self._keys(members)
        goodbye = _one_chunk(bye("the hub closed"))
        payloads = [goodbye + sealer([goodbye])] if (sealer := self._sealer(keys)) else []
        if len(keys) < len(members) or not members:  # sessions without a key read it plain
            payloads.append(goodbye)
        with contextlib.suppress(TransportError):
            self._link.publish_chunks(
                self.settings.hub(self.hub_id), payloads, deadline_after(BYE_TIMEOUT)
            )
        self._link.close()
        self._work.put(None)
        self._worker.join(timeout=5)


class MqttChannel(Channel):
    """A client of an :class:`MqttHub`; waits up to ``timeout`` seconds for broker and hub.

    ``tls``: the link's TLS to the broker (its ``ca`` checks the broker's certificate, ``cert``
    is shown if the broker asks); ``key``: this device's enrolled secret, proven to the hub.
    """

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
        tls: TLS | None = None,
        key: Any = None,
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self._shown = _redacted(url)  # the URL in messages
        self._credentials(tls, key)
        self.settings = MqttSettings.from_url(url, qos, chunk_bytes, tls=tls is not None)
        self.client_id = _check_client_id(client_id or default_client_id())
        self._cond = threading.Condition()
        self._closed = True
        self.reconnect(timeout)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)connect to the broker, subscribe, and say hello until the hub welcomes us; an
        open session is ended with a bye first."""
        if not self._closed:
            self.close()
        s, cid = self.settings, self.client_id
        deadline = deadline_after(timeout)
        session = self._client_session(f"the hub at {self._shown}")
        sid = session.session
        # Encoded once: every repeat is the same hello (the hub checks its nonce only once).
        self._session, self._hello = session, session.hello()
        self._seq = itertools.count()  # the sequence numbers of this session's sealed payloads
        self._window = ReplayWindow()  # the hub's sealed payloads to this session
        self._will_key = None if self.secret is None else _will_key(self.secret, cid, sid)
        self._will_seq = itertools.count()  # the sequence numbers of what the will key seals
        self._early: list[tuple[str, bytes, bool]] = []  # the hub's, before the key to check them
        self._early_bytes = 0
        self._ask_when_open = False  # the link came back before the welcome: ask, sealed, after
        self._up, self._ctl_topic = s.up(cid, sid), s.ctl(cid, sid)
        self._data_topics = (s.down(), s.down(cid, sid))
        self._hub_prefix = s.hub("")
        self._inbox = Inbox()
        most = PREFIX_SIZE + self.limits.max_header_bytes + self.limits.max_message_bytes
        self._data = _Chunks(most, REASSEMBLY_TIMEOUT_S[s.qos])
        self._control = _Chunks(_CONTROL_BYTES, HANDSHAKE_TIMEOUT_S)
        self._hub_id: str | None = None  # the hub that welcomed us
        self._error: Exception | None = None  # why the handshake failed
        self._forged: AuthenticationError | None = None  # why a welcome was not the hub's
        self._gone: PeerGone | None = None  # the session ended: the hub left
        self._unsure = False  # the broker lost the sessions: the hub may not be subscribed
        self._stopping = False
        self._ask(deadline)
        self._link = _Link(
            s,
            tls=_link_tls(s, self.tls),
            will=lambda: (self._up, _sealed_chunk(_will("connection lost"), self._will_sealer())),
            subscriptions=[*self._data_topics, self._ctl_topic, s.hub()],
            on_message=self._on_message,
            on_lost=self._medium_lost,
            on_back=self._medium_back,
        )
        self._link.connect(deadline, timeout)
        self._keeper = threading.Thread(
            target=self._keep, name=f"tensorwire-mqtt-{cid}", daemon=True
        )
        self._keeper.start()
        with self._cond:
            self._cond.wait_for(
                lambda: session.state is not State.AWAIT_WELCOME or self._error is not None,
                remaining(deadline),
            )
            error = self._error
        if error is None and session.state is not State.OPEN and self._forged is not None:
            error = AuthenticationError(
                f"no hub that knows {cid!r}'s secret welcomed it at {self._shown} within "
                f"{timeout} s: {self._forged}"
            )
        elif error is None and session.state is not State.OPEN:
            error = TransportTimeout(
                f"no hub welcomed {cid!r} at {self._shown} within {timeout} s "
                "(is the hub running, on the same broker and prefix?)"
            )
        if error is not None:
            self._end(goodbye=not isinstance(error, SessionRefused))  # a late welcome is undone
            raise error
        welcome = session.welcome
        assert welcome is not None
        self.hub_decoders = welcome.decoders
        self.hub_max_bytes = welcome.max_message_bytes
        self._closed = False

    def _ask(self, until: float | None) -> None:
        """Say hello from now on, until the hub welcomes us or ``until`` (monotonic; None: no
        end) passes; under ``_cond``."""
        self._asking, self._asking_until = True, until
        self._hello_due, self._hello_wait = 0.0, HELLO_RETRY_S[0]

    def _fail(self, exc: PeerGone) -> None:
        """The session is over: ``recv`` raises ``exc`` once the queue is empty, ``send`` at
        once; under ``_cond``."""
        if self._gone is None:
            self._gone = exc
            self._inbox.fail(exc)
            self._cond.notify_all()

    def _dropped(self, topic: str, what: object, key: str = "") -> None:
        """Log, rate-limited per ``key`` (default: the topic), a message dropped unread."""
        _log_limited(
            f"mqtt {self.client_id} {key or topic}",
            f"mqtt: {self.client_id!r} dropped a message on {topic}: {what}",
        )

    def _sealer(self) -> Sealer | None:
        """What seals this session's payloads once it has a key; None before, or without."""
        key = self._session.key
        return None if key is None else Sealer([key], self.client_id.encode(), self._seq)

    def _will_sealer(self) -> Sealer | None:
        """What seals the will, and a bye before the welcome, with the will key."""
        if self._will_key is None:
            return None
        return Sealer([self._will_key], self.client_id.encode(), self._will_seq)

    # -- network thread ---------------------------------------------------------------

    def _on_message(self, topic: str, payload: bytes, dup: bool) -> None:
        if topic in self._data_topics:
            self._on_data(topic, payload, dup)
            return
        hub_id = topic[len(self._hub_prefix) :] if topic.startswith(self._hub_prefix) else None
        if hub_id is not None and hub_id != self._hub_id:  # any hub id: one log key for them all
            self._dropped(topic, "a message of another hub's", "hub topics")
            return
        got = self._control_message(topic, payload, dup)
        if got is None:
            return
        msg, refusal = got
        drain = False
        with self._cond:
            if topic == self._ctl_topic:
                drain = self._from_hub(msg, refusal)
            elif hub_id is not None:
                self._hub_says(hub_id, msg, refusal)
            self._cond.notify_all()
        if drain:  # the payloads that came before the welcome can be checked now
            early, self._early, self._early_bytes = self._early, [], 0
            for args in early:
                self._on_data(*args)

    def _on_data(self, topic: str, payload: bytes, dup: bool) -> None:
        """A payload on a data topic: checked (with a key), then reassembled."""
        chunk: Any = payload
        if self.secret is not None:
            key = self._session.key
            if key is None:  # before the welcome: held until its key can check it
                if self._early_bytes + len(payload) > EARLY_BYTES:
                    self._dropped(topic, f"more than {EARLY_BYTES} bytes came before the welcome")
                else:
                    self._early.append((topic, payload, dup))
                    self._early_bytes += len(payload)
                return
            try:
                chunk = _unsealed(payload, key, _HUB, self._window, dup)
            except AuthenticationError as exc:
                self._rejected(exc)
                return
            if chunk is None:
                return  # a duplicate delivery
        try:
            done = self._data.feed(chunk, topic)
        except WireError as exc:
            self._dropped(topic, exc)
            return
        if done is not None:  # decoded by recv, into its ``out``
            self._inbox.put((*done, topic))

    def _control_message(
        self, topic: str, payload: bytes, dup: bool
    ) -> tuple[Message, AuthenticationError | None] | None:
        """A message on our control or our hub's topic, and, with a key, why it is not the
        hub's (None: it was sealed by the hub); None when there is nothing to act on."""
        chunk: Any = payload
        refusal: AuthenticationError | None = None
        key = self._session.key
        if key is not None:
            try:
                chunk = _unsealed(payload, key, _HUB, self._window, dup)
            except AuthenticationError as exc:
                chunk, refusal = payload, exc
            if chunk is None:
                return None  # a duplicate delivery
        try:
            done = self._control.feed(chunk, topic)
            if done is None:
                return None
            msg = decode_message(done[0], limits=HELLO_LIMITS, codec_lookup=get_codec)
        except WireError as exc:
            self._dropped(topic, exc if refusal is None else refusal)
            return None
        return msg, refusal

    def _from_hub(self, msg: Message, refusal: AuthenticationError | None) -> bool:
        """A welcome or refuse on our session's control topic (under ``_cond``); True when it
        opened the session."""
        s = self._session
        if msg.kind not in ("welcome", "refuse"):
            self._dropped(self._ctl_topic, f"a {msg.kind!r} message where only welcome goes")
        elif s.state is State.AWAIT_WELCOME:
            try:
                event = s.receive(msg)
            except AuthenticationError as exc:
                if s.state is not State.AWAIT_WELCOME:  # the hub refused our credential
                    self._error = exc
                else:  # a welcome without proof of our secret: forged, or another hub's
                    self._forged = exc
                    self._rejected(exc)
                return False
            except TransportError as exc:  # refused, another version, not a hub
                self._error = exc
                return False
            if isinstance(event, Welcomed):
                hub = event.meta.get("hub")
                if isinstance(hub, str) and hub:
                    self._hub_id, self._asking = hub, False
                    if self._ask_when_open:  # the hub may have lost us: ask, now sealed
                        self._ask(time.monotonic() + WILL_GRACE_S)
                    return True
                self._error = TransportError(
                    f"{self._shown}: the welcome names no hub id: is the hub a tensorwire "
                    "mqtt hub of this version?"
                )
        elif (
            s.state is State.OPEN
            and msg.kind == "welcome"
            and (msg.meta.get("session"), msg.meta.get("hub")) == (s.session, self._hub_id)
        ):
            if refusal is not None:
                # a copy of the first welcome (it answers a hello sent before it came, or
                # someone replays it): proves nothing, as the answer to a sealed hello would
                log.debug("mqtt: %r: an unsealed welcome again: %s", self.client_id, refusal)
                return False
            if self._asking:
                log.info("mqtt: %r: the hub answered; the session goes on", self.client_id)
            self._asking = self._unsure = False  # it answered a repeated hello: it is there
        else:
            self._dropped(self._ctl_topic, f"a {msg.kind} for another session or hub")
        return False

    def _hub_says(self, hub_id: str, msg: Message, refusal: AuthenticationError | None) -> None:
        """A message on our hub's topic (under ``_cond``): its bye (sealed, with a key) ends the
        session, its will makes us ask whether it is still there."""
        topic = self._hub_prefix + hub_id
        if msg.kind != "bye":
            self._dropped(topic, f"a {msg.kind!r} message, not our hub's bye", "hub topics")
        elif _is_will(msg):  # never sealed: the hub has no member when it connects
            _log_limited(  # a stranger may repeat it: it costs hellos, and log lines no more
                f"mqtt {self.client_id} hub will",
                f"mqtt: {self.client_id!r}: the hub's connection died; asking if it is back",
            )
            self._ask(time.monotonic() + WILL_GRACE_S)
        elif refusal is not None:
            self._rejected(refusal)
        else:
            self._session.receive(msg)
            self._fail(self._session.closed_error())

    def _medium_lost(self, detail: str) -> None:
        log.warning("mqtt: %r %s; reconnecting", self.client_id, detail)

    def _medium_back(self, detail: str, kept: bool) -> None:
        (log.info if kept else log.warning)("mqtt: %r is %s", self.client_id, detail)
        with self._cond:
            if self._session.state is State.OPEN:  # is the hub still there? (its will may be lost)
                self._ask(time.monotonic() + WILL_GRACE_S)
                self._unsure = self._unsure or not kept
            else:
                self._hello_due = 0.0
                self._ask_when_open = True
            self._cond.notify_all()

    # -- keeper thread ----------------------------------------------------------------

    def _keep(self) -> None:
        """Say hello while asking; end the session when the hub does not answer in time;
        expire partial messages. A grace counts connected time only."""
        next_tick = 0.0
        while True:
            hello, sealer = False, None
            with self._cond:
                if self._stopping:
                    return
                if self._gone is not None:
                    break
                now = time.monotonic()
                active = self._asking and self._error is None and self._link.up
                if active:
                    if self._asking_until is not None and now >= self._asking_until:
                        self._asking = False
                        if self._session.state is State.OPEN:
                            self._fail(
                                PeerGone(
                                    f"the hub at {self._shown} did not answer for {WILL_GRACE_S} s "
                                    "after its connection or ours dropped; call reconnect()"
                                )
                            )
                            continue
                    elif now >= self._hello_due:
                        # once welcomed, sealed: only the session's own client can ask so
                        hello, sealer = True, self._sealer()
                        self._hello_due = now + self._hello_wait
                        self._hello_wait = min(self._hello_wait * 2, HELLO_RETRY_S[1])
                if not hello:
                    wake = min(next_tick, self._hello_due) if active else next_tick
                    self._cond.wait(min(max(wake - now, 0.005), TICK_S))
            if hello:
                self._link.publish_nowait(self._up, _sealed_chunk(self._hello, sealer))
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + TICK_S
                for lost in self._data.expire():
                    _lost_message(repr(self.client_id), lost)
                self._control.expire()
        self._link.close()  # the hub is gone: nobody to say goodbye to

    # -- caller's thread --------------------------------------------------------------

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        give_up = deadline_after(MAX_OUTAGE_S) if deadline is None else deadline
        with self._cond:  # after the broker lost the sessions, wait for the hub's answer
            self._cond.wait_for(
                lambda: not self._unsure or self._gone is not None or self._stopping,
                remaining(give_up),
            )
            unsure = self._unsure
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        if self._gone is not None:
            raise PeerGone(str(self._gone))
        if unsure:
            raise TransportTimeout(
                f"the hub at {self._shown} has not answered since the broker lost its sessions"
            )
        self._link.publish(self._up, enc, deadline, self._sealer())

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        while True:
            if self._closed:
                raise PeerGone("channel is closed; call reconnect()")
            buf, first_byte_at, topic = self._inbox.get(deadline)
            try:
                msg = self._decode_whole(buf, first_byte_at, out=out)
            except WireError as exc:
                self._dropped(topic, exc)
                continue
            if msg.kind == "data":
                return msg
            self._dropped(topic, f"a {msg.kind!r} message where only data goes")

    def _end(self, *, goodbye: bool, graceful: bool = True) -> None:
        """Stop the keeper, say bye if asked, disconnect; ``recv`` raises from now on."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._keeper.join(timeout=5)
        if goodbye and self._gone is None and self._link.up:
            # before the welcome (the hub may have joined us late) the will key seals it
            sealer = self._sealer() or self._will_sealer()
            with contextlib.suppress(TransportError):
                self._link.publish_chunks(
                    self._up, [_sealed_chunk(bye(), sealer)], deadline_after(BYE_TIMEOUT)
                )
        self._link.close(graceful=graceful)
        self._early, self._early_bytes = [], 0  # its network thread has ended
        self._inbox.fail(PeerGone("channel is closed; call reconnect()"))

    def _drop(self) -> None:
        """End the connection as if the network died: no goodbye, the broker sends our will."""
        self._closed = True
        self._end(goodbye=False, graceful=False)

    def close(self) -> None:
        """Say goodbye to the hub and disconnect."""
        if self._closed:
            return
        self._closed = True
        self._end(goodbye=True)


class MqttsHub(MqttHub):
    """:class:`MqttHub` for ``mqtts://`` URLs: the link to the broker runs TLS (port 8883 by
    default)."""

    protocol = "mqtts"


class MqttsChannel(MqttChannel):
    """:class:`MqttChannel` for ``mqtts://`` URLs: the link to the broker runs TLS."""

    protocol = "mqtts"
