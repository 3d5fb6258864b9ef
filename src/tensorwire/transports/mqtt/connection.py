"""A connection to an MQTT broker (paho, MQTT 5) that stays up for as long as it lives, and
publishing on it with the broker's acknowledgement of every chunk."""

from __future__ import annotations

import collections
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tensorwire.errors import (
    AuthenticationError,
    BrokerFull,
    DeliveryUncertain,
    PeerGone,
    TransportError,
    TransportTimeout,
)
from tensorwire.transports.base import dial, remaining
from tensorwire.transports.broker.payloads import sealed
from tensorwire.transports.mqtt import loop as loops
from tensorwire.transports.mqtt.client import paho_client
from tensorwire.transports.mqtt.loop import run_safely
from tensorwire.transports.mqtt.settings import MqttSettings
from tensorwire.transports.security import TLS, Sealer
from tensorwire.wire import CHUNK_HEADER_SIZE, EncodedMessage, iter_chunks, new_message_id

log = logging.getLogger("tensorwire.transports.mqtt")

MQTT_MAX_PACKET = 268_435_455 + 5  # the protocol's largest remaining length + fixed header
# Mosquitto drops QoS 1/2 messages queued for a slow subscriber past max_queued_messages
# (1000 by default): bigger chunks keep one message well below that.
MAX_CHUNKS_PER_MESSAGE = 512
# Our MQTT 5 Receive Maximum, the most allowed: else Mosquitto sends 20 QoS 1/2 messages at a
# time, queues 1,000 and drops the rest (a hub lost the hellos of 2,000 devices joining at once).
RECEIVE_MAXIMUM = 65_535
WINDOW_BYTES = 8 << 20  # published but unacknowledged, per send
# Seconds of MQTT keep-alive. paho drops its connection when a PINGRESP is a keep-alive late,
# the broker a client silent for 1.5 keep-alives (then sends its will). At 60 s a device lost
# its broker connection at 20 % loss ("Keep alive timeout"): TCP backoff stalls a connection
# for a minute or more. A connection that really closes is noticed at once either way.
KEEPALIVE_S = 180
# Seconds the broker keeps a disconnected client's session (subscriptions, queued messages).
# Longer rides out longer outages, but the broker queues a vanished client's messages as long.
SESSION_EXPIRY_S = 300
MAX_OUTAGE_S = SESSION_EXPIRY_S  # a send without deadline gives up on a broker gone this long
_NO_ENTRY = (134, 135)  # CONNACK reasons "bad user name or password", "not authorized"
# Connections a broker whose limit the URL names (connection_max=) ends before its CONNACK,
# one after another, before a device takes it as full: Mosquitto at its max_connections
# closes each new one at once (paho retries after 0.1, 0.2 and 0.4 s).
FULL_AFTER = 3
CLOSE_WAIT_S = 5.0  # how long a close waits for the loop to send the DISCONNECT and let go


class BrokerConnection:
    """One paho client that stays connected for as long as it lives, driven by a network loop:
    the process's shared one (:func:`loop.shared`), or with ``private`` one of its own.

    It keeps one MQTT session (clean start off, ``SESSION_EXPIRY_S``): after a loss the loop
    reconnects with backoff, paho sends again what the broker had not acknowledged, and if the
    broker lost the session the connection subscribes again. ``tls`` makes it TLS to the broker.
    ``will()`` gives the topic and payload of the will for each connection.
    ``on_message(topic, payload, dup)`` (``dup``: the broker's redelivery), ``on_lost(detail)``
    and ``on_back(detail, kept)`` (``kept``: the broker still had our session) are called from
    the loop's thread and must not wait on it, nor on any connection the loop drives.
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
        private: bool = False,
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
        self._awaited: dict[int, bool] = {}  # message ids a send waits on: acknowledged yet?
        self.closing = False
        self.connects = 0  # CONNACKs that let us in: the loop's redial backoff starts again
        self.loop: loops.NetworkLoop | None = None  # the loop driving it, once connected
        self._private = private
        self._down_since: float | None = None  # monotonic, while the connection is lost
        self._generation = 0  # connections made: a QoS 0 publish is lost with its connection
        self.sessions_lost = 0  # reconnects that found our session gone, and what it held
        client = paho_client(settings, tls)
        # set before the first connect: else paho writes from the caller's thread
        client.on_socket_register_write = lambda _c, _u, _s: self._poke()
        client.on_socket_close = lambda _c, _u, sock: self._socket_closing(sock)
        client.on_connect = self._connected
        client.on_disconnect = self._disconnected
        client.on_subscribe = self._subscribed
        client.on_publish = self._acknowledged
        client.on_message = self._received
        self.client = client
        self._arm_will()

    def _arm_will(self) -> None:
        """Set the will for the next connection (a fresh payload each time)."""
        topic, payload = self._will()
        self.client.will_set(topic, payload, qos=self.settings.qos)

    # -- the loop's thread ------------------------------------------------------------

    def _poke(self) -> None:
        loop = self.loop
        if loop is not None:  # before the loop takes it, adding it looks at what is queued
            loop.poke(self)

    def _socket_closing(self, sock: Any) -> None:
        loop = self.loop
        if loop is not None:
            loop.socket_closing(self, sock)

    def _received(self, _c: Any, _u: Any, msg: paho.MQTTMessage) -> None:
        run_safely(
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
            self.connects += 1
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
            if self.closing:
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

    def _acknowledged(self, _c: Any, _u: Any, mid: int, _reason: Any, _props: Any) -> None:
        # a waiting send wakes here: paho's wait_for_publish polls 10 times a second, thousands
        # of wake-ups a second in a process of many connections, all queueing for the GIL
        with self._cond:
            if mid in self._awaited:
                self._awaited[mid] = True
                self._cond.notify_all()

    # -- caller's thread --------------------------------------------------------------

    def connect(self, deadline: float | None, timeout: float | None) -> None:
        """Connect (retrying while nothing listens), wait for the CONNACK, then subscribe."""
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY_S
        props.ReceiveMaximum = RECEIVE_MAXIMUM
        s = self.settings

        def attempt(_deadline: float | None) -> Any:
            try:
                # clean_start=False from the first connect: Mosquitto saves no session that
                # began clean; the client id is fresh, so there is nothing stale to resume.
                return self.client.connect(
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
        self._attach()
        limit = s.connection_max
        try:
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        self._connack is not None
                        or (limit is not None and self._unanswered >= FULL_AFTER)
                    ),
                    remaining(deadline),
                )
                reason, unanswered = self._connack, self._unanswered
            if reason is None and limit is not None and unanswered >= FULL_AFTER:
                raise BrokerFull(
                    f"the broker at {self.address} ended {unanswered} connections unanswered: "
                    f"it lets in {limit} connections (its connection limit) and holds them all, "
                    "so this device does not fit until another leaves: give it room for more "
                    f"devices (MosquittoBroker(devices=N)){self._wrong_port()}"
                )
            if reason is None:
                hint = ""
                if unanswered:  # as a full broker does, and a TLS listener with MQTT in clear
                    hint = (
                        f": it ended {unanswered} connections unanswered (is it full, at its "
                        f"max_connections?{self._wrong_port()})"
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

    def _attach(self) -> None:
        """Have a loop drive the client from now on (its CONNECT is queued)."""
        for _ in range(3):  # a loop refuses only while it ends, and the next one is new
            loop = (
                loops.NetworkLoop("tensorwire-mqtt-own-loop") if self._private else loops.shared()
            )
            self.loop = loop
            if loop.add(self):
                return
        raise TransportError("no network loop took the connection")  # pragma: no cover

    def _wrong_port(self) -> str:
        """The other cause of connections ended unanswered."""
        other = "MQTT in clear" if self.tls else "TLS: use mqtts:// or tls="
        return f"; or is its port for {other}?"

    def _subscribe(self, deadline: float | None) -> None:
        """Subscribe to the connection's topics at its QoS and wait until the broker confirms."""
        topics = self._subscriptions
        with self._cond:  # registered before the SUBACK can come
            rc, mid = self.client.subscribe([(t, self.settings.qos) for t in topics])
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
            (sealed(parts, sealer) for parts in iter_chunks(enc.frames(), new_message_id(), size)),
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
        info = self.client.publish(topic, payload, qos=self.settings.qos)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS and (
            info.rc != MQTTErrorCode.MQTT_ERR_NO_CONN or not self.settings.qos
        ):
            log.info("mqtt: could not publish on %s: %s", topic, paho.error_string(info.rc))

    def _check_usable(self) -> None:
        """Raise :class:`PeerGone` if the connection is closed or the broker gone too long (under
        ``_cond``)."""
        if self.closing:
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
        info = self.client.publish(topic, payload, qos=self.settings.qos)
        if info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and self.settings.qos:
            # lost just now: paho keeps it and sends it once reconnected; the rc would make
            # is_published() raise although the PUBACK will mark it published
            info.rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        elif info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise TransportError(f"could not publish on {topic!r}: {paho.error_string(info.rc)}")
        return info, generation

    def _wait(self, info: paho.MQTTMessageInfo, generation: int, deadline: float | None) -> None:
        # woken by the acknowledgement (_acknowledged) or a lost connection; 1 s slices else
        mid = info.mid
        with self._cond:
            self._awaited[mid] = False
        try:
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
                    if not self._awaited[mid]:
                        self._cond.wait(1.0 if left is None else min(left, 1.0))
                if self._awaited.get(mid):  # paho marks it published right after the callback
                    info.wait_for_publish(1.0)
        finally:
            with self._cond:
                self._awaited.pop(mid, None)

    def close(self, graceful: bool = True) -> None:
        """Disconnect and let the loop go of it. ``graceful``: the broker ends our session and
        discards the will; otherwise the connection just dies (as when the process is killed)
        and the will goes out. Waits up to ``CLOSE_WAIT_S`` (not on the loop's own thread)."""
        with self._cond:
            if self.closing:
                return
            self.closing = True
            self.up = False
            self._cond.notify_all()
        loop = self.loop
        if loop is None:  # never connected: there is nothing to end
            return

        def finish(client: Any) -> None:
            if graceful:
                props = Properties(PacketTypes.DISCONNECT)
                props.SessionExpiryInterval = 0
                client.disconnect(properties=props)
            else:
                sock = client.socket()
                if isinstance(sock, socket.socket):  # a plain or TLS socket: paho's TCP transport
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

        loop.remove(self, finish, None if loop.on_thread() else CLOSE_WAIT_S)
