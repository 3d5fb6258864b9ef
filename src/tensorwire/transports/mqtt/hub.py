"""The hub of ``mqtt://``: sessions opened by hellos on the uplinks under the prefix, a worker
thread that handles whole messages, and the hub's will (see the package's docstring)."""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tensorwire.codecs import get_codec
from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    SessionRefused,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.base import HubOptions, deadline_after, remaining
from tensorwire.transports.broker import (
    BrokerHub,
    BrokerPeer,
    Inflow,
    lone_chunk,
    one_chunk,
    unsealed,
)
from tensorwire.transports.mqtt.client import connection_tls
from tensorwire.transports.mqtt.connection import MAX_OUTAGE_S, BrokerConnection
from tensorwire.transports.mqtt.loop import run_safely
from tensorwire.transports.mqtt.settings import (
    BYE_TIMEOUT,
    CONTROL_BYTES,
    HANDSHAKE_TIMEOUT_S,
    REASSEMBLY_TIMEOUT_S,
    TICK_S,
    MqttHubOptions,
    MqttSettings,
)
from tensorwire.transports.mqtt.will import WILL_GRACE_S, is_will, will, will_key
from tensorwire.transports.security import Keys, ReplayWindow
from tensorwire.transports.session import HELLO_LIMITS, Closed, Data, Hello, HubSession, Joined, bye
from tensorwire.transports.url import redacted
from tensorwire.wire import EncodedMessage, Message, decode_message

log = logging.getLogger("tensorwire.transports.mqtt")


@dataclass(eq=False)
class _Peer(BrokerPeer):
    """A client's open session on the hub."""

    sid: str = ""  # its session id, the last level of its topics
    will_key: bytes | None = None  # checks its wills (and a bye before its welcome)
    will_window: ReplayWindow = field(default_factory=ReplayWindow)  # its wills' numbers
    unsure: bool = False  # the broker lost the sessions: subscribed again only once it says hello


class MqttHub(BrokerHub[_Peer]):
    """Hub on the topics under an ``mqtt://host:port/prefix`` URL's prefix (see the package doc).

    The credentials' ``tls`` is the connection's TLS to the broker (its ``ca`` checks the
    broker's certificate; its ``cert`` is shown if the broker asks for one); their ``keys`` admit
    clients here: the hub never sees a client's certificate, the broker does.
    ``authenticate`` runs on the MQTT network thread: it must not send.
    """

    protocol = "mqtt"
    options_type: ClassVar[type[HubOptions]] = MqttHubOptions
    options: MqttHubOptions

    def __init__(self, url: str, options: MqttHubOptions) -> None:
        tls = options.credentials.tls is not None
        s = MqttSettings.from_url(url, options.qos, options.chunk_bytes, tls=tls)
        timeout = REASSEMBLY_TIMEOUT_S[s.qos]
        super().__init__(url, options, grace=WILL_GRACE_S, reassembly_timeout=timeout)
        self.settings = s
        self.connection_max = s.connection_max  # a hub warns before its devices fill it
        if self.tls is not None and self.authenticate is None:
            log.warning(
                "mqtt: the hub at %s has TLS settings but no auth= keys: client certificates "
                "reach the broker, never the hub, so it admits ANYONE who can use the broker",
                redacted(url),
            )
        self.hub_id = uuid.uuid4().hex  # names this hub's topic; its welcomes carry it
        self._strangers = Inflow(CONTROL_BYTES, HANDSHAKE_TIMEOUT_S)
        self._up_prefix = f"{s.prefix}/up/"
        # Whole messages are decoded and handled off the network thread, so that a callback
        # (on_join, say) may send, which needs that thread to take the broker's PUBACKs.
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._worker = threading.Thread(
            target=self._work_loop, name="tensorwire-mqtt-hub", daemon=True
        )
        self._worker.start()
        hub_will = will("the hub's connection died")
        self._connection = BrokerConnection(
            s,
            tls=connection_tls(s, self.tls),
            # unsealed (no member is known at CONNECT): it only makes clients ask
            will=lambda: (s.hub(self.hub_id), one_chunk(hub_will)),
            subscriptions=[s.up("+", "+")],
            on_message=self._on_message,
            on_lost=lambda detail: self._work.put(functools.partial(self._medium_lost, detail)),
            on_back=lambda detail, kept: self._work.put(
                functools.partial(self._medium_back_as, detail, kept)
            ),
            private=True,  # no client in this process can hold up the hub's network thread
        )
        timeout = options.timeouts.connect
        try:
            self._connection.connect(deadline_after(timeout), timeout)
        except BaseException:
            self._work.put(None)
            raise

    # -- network thread ---------------------------------------------------------------

    def _on_message(self, topic: str, payload: bytes, dup: bool) -> None:
        cid, _, sid = topic[len(self._up_prefix) :].partition("/")
        peer = self._peer_of(cid)
        if peer is not None and peer.sid == sid:
            self._from_member(cid, peer, payload, dup)
            return
        try:  # no open session here: a hello, or a stranger's, read under the hello limits
            done = self._strangers.feed(payload, topic)
            if done is None:
                return
            msg = decode_message(done[0], limits=HELLO_LIMITS, codec_lookup=get_codec)
        except WireError as exc:  # same type, and why it was read under the hello limits
            self._rejected(cid, type(exc)(f"{exc}, on {topic}: no session open here"))
            return
        if msg.kind == "hello":
            self._open_session(cid, sid, msg, bytes(done[0]))
        elif msg.kind == "bye":
            log.debug("mqtt: a bye for %r's session %s, which is not open", cid, sid)
        else:
            self._rejected(
                cid, SessionRefused(f"a {msg.kind!r} message on {topic}: say hello first")
            )

    def _from_member(self, cid: str, peer: _Peer, payload: bytes, dup: bool) -> None:
        """A payload on an open session's uplink: with a key, checked before it is reassembled."""
        chunk: Any = payload
        if peer.session.key is not None:
            if lone_chunk(payload) == peer.hello:
                # the opening hello again, unsealed: from a client still waiting for the
                # welcome, or a copy someone replays, so it earns the welcome and nothing more
                self._work.put(functools.partial(self._welcome, cid, peer, False))
                return
            try:
                chunk = self._checked(cid, peer, payload, dup)
            except AuthenticationError as exc:
                self._rejected(cid, exc)
                return
            if chunk is None:
                log.debug("mqtt: dropped a duplicate delivery from %r", cid)
                return
        try:
            done = self._inflow.feed(chunk, cid)
        except WireError as exc:
            self._rejected(cid, exc)
            return
        if done is not None:
            self._work.put(functools.partial(self._handle, cid, peer, *done))

    @staticmethod
    def _checked(cid: str, peer: _Peer, payload: bytes, dup: bool) -> memoryview | None:
        """The chunk of a payload sealed with the session key, or with the will key (a will, a
        bye before the welcome); None for a duplicate delivery."""
        key = peer.session.key
        assert key is not None
        try:
            return unsealed(payload, key, cid.encode(), peer.window, dup)
        except AuthenticationError:
            if peer.will_key is None:
                raise
            # a payload sealed for another key has no entry for this one: cheap to rule out
            with contextlib.suppress(AuthenticationError):
                return unsealed(payload, peer.will_key, cid.encode(), peer.will_window, dup)
            raise

    def _open_session(self, cid: str, sid: str, msg: Message, hello_bytes: bytes) -> None:
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
            refusal = one_chunk(session.refusal(exc))
            self._connection.publish_nowait(self.settings.ctl(cid, sid), refusal)
            self._work.put(functools.partial(self._refused, cid, exc))
            return
        peer = _Peer(session, hello_bytes, sid=sid, will_key=self._will_key_of(hello, session))
        self._add_peer(cid, peer)  # from now on this session's chunks are a member's
        self._work.put(functools.partial(self._admit, cid, peer))

    def _will_key_of(self, hello: Hello, session: HubSession) -> bytes | None:
        """The session's will key, when it has a session key and the hub the client's secret."""
        keys = getattr(self.authenticate, "keys", None)
        if session.key is None or not isinstance(keys, Keys):
            return None
        secret = keys.get(hello.client_id)
        return None if secret is None else will_key(secret, hello.client_id, hello.session)

    # -- worker thread ----------------------------------------------------------------

    def _work_loop(self) -> None:
        next_tick = 0.0
        while True:
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + TICK_S
                run_safely(self._tick, "the hub's tick")
            try:
                job = self._work.get(timeout=max(next_tick - time.monotonic(), 0.001))
            except queue.Empty:
                continue
            if job is None:
                return
            run_safely(job, "the hub's worker")

    def _admit(self, cid: str, peer: _Peer) -> None:
        hello = peer.session.hello
        if hello is None or not self._is_current(cid, peer):
            return  # replaced before it was admitted
        self._joined(
            cid, hello.decoders, session=peer.session, max_message_bytes=hello.max_message_bytes
        )
        self._welcome(cid, peer, sealed=False)

    def _welcome(self, cid: str, peer: _Peer, sealed: bool) -> None:
        """Publish the session's welcome, ``sealed`` (answering a sealed hello: the client has
        the key) or not (the first, or answering the unsealed hello of a client without it)."""
        key = peer.session.key
        sealer = self._sealer([key]) if sealed and key is not None else None
        welcome = one_chunk(peer.session.welcome(), sealer)
        self._connection.publish_nowait(self.settings.ctl(cid, peer.sid), welcome)

    def _handle(self, cid: str, peer: _Peer, buf: Any, first_byte_at: float) -> None:
        """A whole message from a member's session, in the order its chunks came."""
        if not self._is_current(cid, peer):
            log.info("mqtt: dropped a message of %r's session %s, which ended", cid, peer.sid)
            return
        try:
            msg = self._decode_whole(buf, first_byte_at)
        except WireError as exc:
            self._rejected(cid, exc)
            return
        if msg.kind == "hello":  # asked again (sealed, with a key): reconnected, or probes us
            peer.session.receive(msg)
            with self._changed:  # it subscribed before it said hello: sends to it may go now
                self._graces.clear(cid)
                peer.unsure = False
                self._changed.notify_all()
            self._welcome(cid, peer, sealed=True)
            return
        if is_will(msg):
            log.info(
                "mqtt: client %r: its connection died; it has %s s to come back", cid, WILL_GRACE_S
            )
            with self._lock:
                self._graces.suspect(cid, "connection lost", time.monotonic())
            return
        event = peer.session.receive(msg)
        if isinstance(event, Data):
            self._delivered(cid, msg)
        elif isinstance(event, Closed):
            self._forget(cid, peer, event.reason)
        else:
            log.debug("mqtt: %r: %s", cid, event)

    def _medium_back_as(self, detail: str, kept: bool) -> None:
        """Back; if the broker lost the sessions (and with them the wills of clients that died
        meanwhile), every client must say hello again within a grace."""
        if not kept:
            why = "did not come back after the broker lost its sessions"
            with self._lock:
                for cid, peer in self._peers.items():
                    peer.unsure = True
                    self._graces.suspect(cid, why, time.monotonic())
        self._medium_back(detail)

    def _tick(self) -> None:
        for topic, exc in self._strangers.expire():
            log.debug("mqtt: gave up on a stranger's message on %s: %s", topic, exc)
        super()._tick()

    # -- caller's thread --------------------------------------------------------------

    def _unreachable(self, clients: list[str], deadline: float | None) -> dict[str, Exception]:
        """Wait until none of ``clients`` is unsure (a message to it now could find it not yet
        subscribed again); return the error of each that left, or is still unsure at
        ``deadline`` (without one, after ``MAX_OUTAGE_S``)."""
        give_up = deadline_after(MAX_OUTAGE_S) if deadline is None else deadline

        def unsure(cid: str) -> bool:
            return (peer := self._peers.get(cid)) is not None and peer.unsure

        with self._changed:
            self._changed.wait_for(lambda: not any(map(unsure, clients)), remaining(give_up))
            failed: dict[str, Exception] = {}
            for cid in clients:
                if cid not in self._peers:
                    failed[cid] = PeerGone(f"client {cid!r} is not connected")
                elif unsure(cid):
                    failed[cid] = TransportTimeout(
                        f"client {cid!r} has not come back since the broker lost its sessions"
                    )
            return failed

    def _publish_to(
        self, client_id: str, peer: _Peer, enc: EncodedMessage, deadline: float | None, sealer: Any
    ) -> None:
        self._connection.publish(self.settings.down(client_id, peer.sid), enc, deadline, sealer)

    def _publish_all(self, enc: EncodedMessage, deadline: float | None, sealer: Any) -> None:
        self._connection.publish(self.settings.down(), enc, deadline, sealer)

    def _close_transport(self) -> None:
        with self._lock:
            peers = list(self._peers.values())
        keys = self._keys(peers)
        goodbye = one_chunk(bye("the hub closed"))
        payloads = [goodbye + sealer([goodbye])] if (sealer := self._sealer(keys)) else []
        if len(keys) < len(peers) or not peers:  # sessions without a key read it plain
            payloads.append(goodbye)
        with contextlib.suppress(TransportError):
            self._connection.publish_chunks(
                self.settings.hub(self.hub_id), payloads, deadline_after(BYE_TIMEOUT)
            )
        self._connection.close()
        self._work.put(None)
        self._worker.join(timeout=5)


class MqttsHub(MqttHub):
    """:class:`MqttHub` for ``mqtts://`` URLs: the connection to the broker runs TLS (port 8883
    by default)."""

    protocol = "mqtts"
