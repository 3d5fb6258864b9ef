"""The channel of ``mqtt://``: it subscribes, then says hello until the hub welcomes it, keeps
asking whether the hub is there when a will or the broker's restart casts doubt on it, and
checks everything the hub sends (see the package's docstring)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
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
from tensorwire.transports.base import (
    ChannelOptions,
    Inbox,
    _log_limited,
    deadline_after,
    remaining,
)
from tensorwire.transports.broker import HUB_SENDER, BrokerChannel, Inflow, one_chunk, unsealed
from tensorwire.transports.mqtt.client import connection_tls
from tensorwire.transports.mqtt.connection import MAX_OUTAGE_S, BrokerConnection
from tensorwire.transports.mqtt.loop import Timer
from tensorwire.transports.mqtt.settings import (
    BYE_TIMEOUT,
    CONTROL_BYTES,
    HANDSHAKE_TIMEOUT_S,
    HELLO_RETRY_S,
    REASSEMBLY_TIMEOUT_S,
    TICK_S,
    MqttChannelOptions,
    MqttSettings,
    check_client_id,
)
from tensorwire.transports.mqtt.will import WILL_GRACE_S, is_will, will, will_key
from tensorwire.transports.security import Sealer
from tensorwire.transports.session import HELLO_LIMITS, State, Welcomed, bye
from tensorwire.wire import EncodedMessage, Message, decode_message

log = logging.getLogger("tensorwire.transports.mqtt")


class MqttChannel(BrokerChannel):
    """A client of an :class:`MqttHub`; waits up to ``timeouts.connect`` seconds for broker
    and hub. The credentials' ``tls`` is the connection's TLS to the broker (its ``ca`` checks
    the broker's certificate, ``cert`` is shown if the broker asks); their ``secret`` is proven
    to the hub.
    """

    protocol = "mqtt"
    options_type: ClassVar[type[ChannelOptions]] = MqttChannelOptions
    options: MqttChannelOptions
    _connection: BrokerConnection | None = None
    _keep_timer: Timer | None = None  # the keeper's next round
    _keeper = -1  # the session whose keeper runs (a round of an earlier one does nothing)

    def __init__(self, url: str, options: MqttChannelOptions) -> None:
        super().__init__(url, options)
        tls = self.tls is not None
        self.settings = MqttSettings.from_url(url, options.qos, options.chunk_bytes, tls=tls)
        check_client_id(self.client_id)
        self._cond = threading.Condition()
        self._keep_lock = threading.RLock()  # held by a round of the keeper
        self._keep_round = itertools.count()  # a session's keeper, told from an earlier one's
        self.reconnect()

    def _open(self, deadline: float | None) -> Welcomed:
        """Connect to the broker, subscribe, and say hello until the hub welcomes us."""
        s, cid = self.settings, self.client_id
        self._begin_session()
        sid = self._session.session
        self._will_key = None if self.secret is None else will_key(self.secret, cid, sid)
        self._will_seq = itertools.count()  # the sequence numbers of what the will key seals
        self._ask_when_open = False  # the broker came back before the welcome: ask, sealed, after
        self._up, self._ctl_topic = s.up(cid, sid), s.ctl(cid, sid)
        self._data_topics = (s.down(), s.down(cid, sid))
        self._hub_prefix = s.hub("")
        self._inbox = Inbox()
        self._data = Inflow(self._most_bytes, REASSEMBLY_TIMEOUT_S[s.qos])
        self._control = Inflow(CONTROL_BYTES, HANDSHAKE_TIMEOUT_S)
        self._hub_id: str | None = None  # the hub that welcomed us
        self._welcomed: Welcomed | None = None
        self._error: Exception | None = None  # why the handshake failed
        self._gone: PeerGone | None = None  # the session ended: the hub left
        self._unsure = False  # the broker lost the sessions: the hub may not be subscribed
        self._stopping = False
        self._unanswered = 0  # hellos said with no welcome yet
        self._ask(deadline)
        self._connection = BrokerConnection(
            s,
            tls=connection_tls(s, self.tls),
            will=lambda: (self._up, one_chunk(will("connection lost"), self._will_sealer())),
            subscriptions=[*self._data_topics, self._ctl_topic, s.hub()],
            on_message=self._on_message,
            on_lost=self._medium_lost,
            on_back=self._medium_back,
        )
        self._connection.connect(deadline, remaining(deadline))
        self._keeper = next(self._keep_round)
        self._next_tick = 0.0
        self._kick()
        with self._cond:
            self._cond.wait_for(
                lambda: self._welcomed is not None or self._error is not None, remaining(deadline)
            )
            error, welcomed = self._error, self._welcomed
        if error is None and welcomed is None:
            error = TransportTimeout(
                f"no hub welcomed {cid!r} at {self._shown} "
                "(is the hub running, on the same broker and prefix?)"
            )
        if error is not None:
            if not isinstance(error, SessionRefused):
                self._say_goodbye()  # a late welcome is undone
            self._release(graceful=True)
            raise error
        assert welcomed is not None
        return welcomed

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
            self._kick()

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
            self._dropped("a message of another hub's", "hub topics")
            return
        got = self._control_message(topic, payload, dup)
        if got is None:
            return
        msg, refusal = got
        opened = False
        with self._cond:
            if topic == self._ctl_topic:
                opened = self._from_hub(msg, refusal)
            elif hub_id is not None:
                self._hub_says(msg, refusal)
            self._cond.notify_all()
        self._kick()
        if opened:  # the payloads that came before the welcome can be checked now
            for args in self._take_held():
                self._on_data(*args)

    def _on_data(self, topic: str, payload: bytes, dup: bool) -> None:
        """A payload on a data topic: checked (with a key), then reassembled."""
        chunk: Any = payload
        if self.secret is not None:
            key = self._session.key
            if key is None:  # before the welcome: held until its key can check it
                self._hold((topic, payload, dup), len(payload))
                return
            try:
                chunk = unsealed(payload, key, HUB_SENDER, self._window, dup)
            except AuthenticationError as exc:
                self._rejected(exc)
                return
            if chunk is None:
                return  # a duplicate delivery
        try:
            done = self._data.feed(chunk, topic)
        except WireError as exc:
            self._dropped(exc, topic)
            return
        if done is not None:  # decoded by recv, into its ``out``
            self._inbox.put(done)

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
                chunk = unsealed(payload, key, HUB_SENDER, self._window, dup)
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
            self._dropped(exc if refusal is None else refusal, topic)
            return None
        return msg, refusal

    def _from_hub(self, msg: Message, refusal: AuthenticationError | None) -> bool:
        """A welcome or refuse on our session's control topic (under ``_cond``); True when it
        opened the session."""
        s = self._session
        if msg.kind not in ("welcome", "refuse"):
            self._dropped(f"a {msg.kind!r} message where only welcome goes", self._ctl_topic)
        elif s.state is State.AWAIT_WELCOME:
            event = self._answer(msg)
            if isinstance(event, Exception):
                self._error = event
            elif event is not None:
                hub = event.meta.get("hub")
                if isinstance(hub, str) and hub:
                    self._hub_id, self._asking, self._welcomed = hub, False, event
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
            self._dropped(f"a {msg.kind} for another session or hub", self._ctl_topic)
        return False

    def _hub_says(self, msg: Message, refusal: AuthenticationError | None) -> None:
        """A message on our hub's topic (under ``_cond``): its bye (sealed, with a key) ends the
        session, its will makes us ask whether it is still there."""
        if msg.kind != "bye":
            self._dropped(f"a {msg.kind!r} message, not our hub's bye", "hub topics")
        elif is_will(msg):  # never sealed: the hub has no member when it connects
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

    def _medium_back(self, detail: str, kept: bool = True) -> None:
        super()._medium_back(detail, kept)
        with self._cond:
            if self._session.state is State.OPEN:  # is the hub still there? (its will may be lost)
                self._ask(time.monotonic() + WILL_GRACE_S)
                self._unsure = self._unsure or not kept
            else:
                self._hello_due = 0.0
                self._ask_when_open = True
            self._cond.notify_all()
        self._kick()

    # -- the keeper: rounds on the loop's thread -------------------------------------

    def _kick(self) -> None:
        """Have the keeper look now (something it acts on changed)."""
        connection = self._connection
        if connection is not None and connection.loop is not None:
            keeper = self._keeper
            connection.loop.call_soon(lambda: self._keep(keeper))

    def _keep(self, keeper: int) -> None:
        """A round of the keeper (``keeper``: its session's; an earlier one's does nothing):
        say hello while asking; end the session when the hub does not answer in time; expire
        partial messages. A grace counts connected time only. Each round sets the next."""
        connection = self._connection
        assert connection is not None and connection.loop is not None
        with self._keep_lock:
            hello, sealer = False, None
            with self._cond:
                if self._stopping or keeper != self._keeper:
                    return
                now = time.monotonic()
                active = self._asking and self._error is None and connection.up
                if active and self._asking_until is not None and now >= self._asking_until:
                    self._asking = active = False
                    if self._session.state is State.OPEN:
                        self._fail(
                            PeerGone(
                                f"the hub at {self._shown} did not answer for {WILL_GRACE_S} s "
                                "after its connection or ours dropped; call reconnect()"
                            )
                        )
                elif active and now >= self._hello_due:
                    # once welcomed, sealed: only the session's own client can ask so
                    hello, sealer = True, self._sealer()
                    self._hello_due = now + self._hello_wait
                    self._hello_wait = min(self._hello_wait * 2, HELLO_RETRY_S[1])
                gone = self._gone is not None
                wake = min(self._next_tick, self._hello_due) if active else self._next_tick
            if gone:
                connection.close()  # the hub is gone: nobody to say goodbye to
                return
            if hello:
                connection.publish_nowait(self._up, one_chunk(self._hello, sealer))
                self._unanswered += self._session.state is State.AWAIT_WELCOME
                if self._unanswered == 2:  # said once per attempt: the hub may start later
                    log.info("mqtt: %r cannot reach the hub at %s yet", self.client_id, self._shown)
            if now >= self._next_tick:
                self._next_tick = wake = now + TICK_S
                for _, exc in self._data.expire():
                    self._dropped(exc)
                self._control.expire()
                if active:
                    wake = min(wake, self._hello_due)
            if self._keep_timer is not None:
                self._keep_timer.cancel()
            at = now + min(max(wake - now, 0.005), TICK_S)
            self._keep_timer = connection.loop.call_at(at, lambda: self._keep(keeper))

    # -- caller's thread --------------------------------------------------------------

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        give_up = deadline_after(MAX_OUTAGE_S) if deadline is None else deadline
        with self._cond:  # after the broker lost the sessions, wait for the hub's answer
            self._cond.wait_for(
                lambda: not self._unsure or self._gone is not None or self._stopping,
                remaining(give_up),
            )
            unsure = self._unsure
        if self._closed or self._connection is None:
            raise PeerGone("channel is closed; call reconnect()")
        if self._gone is not None:
            raise PeerGone(str(self._gone))
        if unsure:
            raise TransportTimeout(
                f"the hub at {self._shown} has not answered since the broker lost its sessions"
            )
        self._connection.publish(self._up, enc, deadline, self._sealer())

    def _stop_keeper(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        with self._keep_lock:  # a round under way has ended; none starts from now on
            if self._keep_timer is not None:
                self._keep_timer.cancel()

    def _say_goodbye(self) -> None:
        """A bye (before the welcome, the hub may have joined us late: the will key seals it),
        then a disconnect that ends our broker session and discards the will."""
        self._stop_keeper()
        connection = self._connection
        if connection is not None and self._gone is None and connection.up:
            sealer = self._sealer() or self._will_sealer()
            with contextlib.suppress(TransportError):
                goodbye = [one_chunk(bye(), sealer)]
                connection.publish_chunks(self._up, goodbye, deadline_after(BYE_TIMEOUT))
        self._release(graceful=True)

    def _drop(self) -> None:
        """End the connection as if the network died: no goodbye, the broker sends our will."""
        self._closed = True
        self._release(graceful=False)

    def _release(self, *, graceful: bool) -> None:
        """Stop the keeper and disconnect (``graceful``: without the will); ``recv`` raises."""
        if self._connection is None:
            return
        self._stop_keeper()
        self._connection.close(graceful=graceful)
        self._take_held()  # its loop has let go of it
        self._inbox.fail(PeerGone("channel is closed; call reconnect()"))


class MqttsChannel(MqttChannel):
    """:class:`MqttChannel` for ``mqtts://`` URLs: the connection to the broker runs TLS."""

    protocol = "mqtts"
