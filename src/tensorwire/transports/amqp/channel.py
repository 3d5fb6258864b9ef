"""The channel of ``amqp://``: it consumes its own session queue, says hello on the uplink, asks
again after the broker comes back (in a new session if the hub no longer has ours), and counts
the hub as gone once nobody consumes the uplink for a grace (see the package's docstring)."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from typing import Any, ClassVar

import pika.exceptions as px

from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    TransportError,
    TransportTimeout,
    TruncatedMessage,
    WireError,
)
from tensorwire.transports.amqp.connection import CLIENT_HEADER, props, sender_of
from tensorwire.transports.amqp.control import session_message
from tensorwire.transports.amqp.link import Link
from tensorwire.transports.amqp.publisher import LinkPublisher
from tensorwire.transports.amqp.settings import (
    BYE_TIMEOUT,
    CONTROL_CHUNK,
    DEFAULT_CHUNK,
    HELLO_RETRY,
    HELLO_RETRY_MAX,
    HUB,
    HUB_CHECK,
    HUB_GRACE,
    MAX_NAME,
    OUTAGE_LIMIT,
    REASSEMBLY_TIMEOUT,
    RECONNECT_TIMEOUT,
    AmqpAddress,
    AmqpChannelOptions,
    parse_chunk_size,
)
from tensorwire.transports.base import ChannelOptions, Inbox, deadline_after, remaining
from tensorwire.transports.broker import (
    HUB_SENDER,
    BrokerChannel,
    Graces,
    Inflow,
    lone_chunk,
    one_chunk,
    unsealed,
)
from tensorwire.transports.security import Sealer
from tensorwire.transports.session import Closed, State, Welcomed
from tensorwire.wire import PREFIX_SIZE, EncodedMessage, Message, encode_message
from tensorwire.wire.format import parse_prefix

log = logging.getLogger("tensorwire.transports.amqp")


class AmqpChannel(BrokerChannel):
    """A client of an :class:`AmqpHub`; retries until ``timeout`` while the hub is not up.

    ``chunk``: most bytes per AMQP message (default: the URL's, else :data:`DEFAULT_CHUNK`).
    ``tls``: the connection's TLS to the broker (its ``ca`` checks the broker's certificate,
    ``cert`` is shown if the broker asks); ``key``: this device's enrolled secret, proven to
    the hub.
    """

    protocol = "amqp"
    options_type: ClassVar[type[ChannelOptions]] = AmqpChannelOptions
    options: AmqpChannelOptions
    _link: Link | None = None  # the connection, on the process's I/O thread
    _pub: LinkPublisher | None = None
    _begun = False  # this connection's queue, session and publisher are made

    def __init__(self, url: str, options: AmqpChannelOptions) -> None:
        super().__init__(url, options)
        self._address = AmqpAddress(url, self.tls)
        if self._address.prefix is None:
            raise TransportError(
                f"{self._shown!r} names no hub: add ?prefix=... (the hub's .url has it)"
            )
        chunk = options.chunk
        self.chunk = (
            parse_chunk_size(chunk) if chunk is not None else self._address.chunk or DEFAULT_CHUNK
        )
        self._uplink = f"{self._address.prefix}.up"
        self._queue = ""
        self._stale: str | None = None  # the queue of the connection before, deleted once back
        if len(f"{self._address.prefix}.c.{self.client_id}.12345678".encode()) > MAX_NAME:
            raise TransportError(f"client id {self.client_id!r} is too long for an AMQP queue name")
        self._cond = threading.Condition()  # guards _reply; notified when a session opens
        self._inbox = Inbox()
        self._hub_grace = Graces(HUB_GRACE)  # the uplink had no consumer: the hub may be gone
        self.reconnect()

    def _begin(self) -> None:
        """This connection's queue, session and publisher, kept by the attempts that follow."""
        if self._queue:
            self._stale = self._stale or self._queue
        self._queue = f"{self._address.prefix}.c.{self.client_id}.{uuid.uuid4().hex[:8]}"
        self._inbox = Inbox()
        self._inflow = Inflow(self._most_bytes, REASSEMBLY_TIMEOUT)
        self._begin_session(queue=self._queue)
        self._reply: Welcomed | Exception | None = None
        self._rehello_at: float | None = None  # when to say hello again (after a reconnect)
        self._asking_since = 0.0  # when the hello said again after a reconnect began
        self._afresh = False  # asking in a new session: the hub no longer had ours
        self._hub_grace.clear("hub")
        self._next_hub_check = 0.0  # see _on_answer
        self._heard_at = float("-inf")  # when the last chunk from the hub came (monotonic)
        self._hello_wait = HELLO_RETRY  # seconds the next hello waits for its answer
        self._begun = True

    def _open(self, deadline: float | None) -> Welcomed:
        """Consume our queue (once), say hello, and wait a while for the answer."""
        if not self._begun:
            self._begin()
        if self._link is None:
            self._link = Link(
                self._address,
                self.client_id,
                deadline,
                queue=self._queue,
                on_message=self._on_delivery,
                tick=self._tick,
                on_lost=self._medium_lost,
                on_back=self._medium_back,
                on_gone=self._medium_gone,
            )
            self._pub = LinkPublisher(  # on the same connection
                self._link, self.client_id, self._address.persistent
            )
            self._link.start()
        assert self._pub is not None
        self._pub.publish("", self._uplink, self._hello, CONTROL_CHUNK, deadline)
        wait_until = min(time.monotonic() + self._hello_wait, deadline or float("inf"))
        with self._cond:
            while self._reply is None:
                left = remaining(wait_until)
                if left == 0.0:
                    # a hub with many hellos to answer: each repeat would add to its backlog
                    self._hello_wait = min(2 * self._hello_wait, HELLO_RETRY_MAX)
                    raise TransportTimeout(
                        f"the hub at {self._shown} has not answered the hello yet"
                    )
                self._cond.wait(left)
            answer = self._reply
        if isinstance(answer, Exception):
            self._reply = None
            raise answer
        if self._stale:
            self._delete_queue(self._stale)
            self._stale = None
        return answer

    # -- the I/O thread (the link's callbacks) -----------------------------------------------

    def _on_delivery(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        try:
            sender = sender_of(props)
            if sender != HUB:
                raise TransportError(f"a message headed {CLIENT_HEADER}: {sender!r}, not the hub")
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
        whole = self._inflow.feed(chunk, HUB)
        self._heard_at = time.monotonic()  # the hub sent it: no need to look for a while
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
                return unsealed(body, key, HUB_SENDER, self._window, redelivered)
            except AuthenticationError as exc:
                error = exc
        payload = lone_chunk(body)
        msg = None if payload is None else session_message(payload)
        if msg is None and key is None:
            self._hold((exchange, body, redelivered), len(body))
            return None
        if msg is None or exchange or msg.kind not in ("welcome", "refuse"):
            raise error or AuthenticationError(
                "an unsealed message on an authenticated session: the hub seals all but its "
                "first welcome and its refusals"
            )
        self._on_session_message(msg, sealed=False)
        return None

    def _check_early(self) -> None:
        """Check and take what came before the welcome, now that its key is here."""
        for exchange, body, redelivered in self._take_held():
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
        answer = self._answer(msg)
        if answer is not None:
            self._answered(answer)
        if isinstance(answer, Welcomed):
            # a random first look at the uplink: clients that join together (a thousand
            # in a few seconds) do not look together ever after
            self._next_hub_check = time.monotonic() + random.uniform(0.0, HUB_CHECK)
            self._check_early()
            if self._link is not None:
                self._link.poke()  # the tick's next look is due then

    def _answered(self, answer: Welcomed | Exception) -> None:
        with self._cond:
            if not self._afresh:  # connect() waits for it
                self._reply = answer
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
            self._begin_session(queue=self._queue)
            self._afresh = True
        self._rehello_at = self._asking_since = time.monotonic()
        if self._link is not None:
            self._link.poke()

    def _tick(self) -> float:
        """Bookkeeping on the consumer thread; the seconds until it is due again."""
        for _, exc in self._inflow.expire():
            self._dropped(exc)
        now = time.monotonic()
        if self._rehello_at is not None and now >= self._rehello_at:
            sealer = self._sealer()
            if sealer is not None and now - self._asking_since >= HUB_GRACE:
                # no answer to our sealed hello: the hub may have our session under another
                # key (a hub of its own started on the prefix took the first hello again)
                self._ask_afresh(f"it did not answer our sealed hello for {HUB_GRACE:g} s")
                sealer = None
            if self._link is not None:  # confirmed, but nobody waits: unanswered, it goes again
                body = one_chunk(self._hello, sealer)
                self._link.say(
                    "", self._uplink, body, props(self.client_id, self._address.persistent)
                )
            self._rehello_at = now + HELLO_RETRY
        joined = self._session.state is State.OPEN or self._afresh
        if joined and self._inbox.failed is None and now >= self._next_hub_check:
            self._next_hub_check = now + HUB_CHECK
            # a chunk from the hub this recently says it is there: no look at its queue
            # (2,000 clients in a round looked 200 times a second at the one busy queue)
            if now - self._heard_at >= HUB_CHECK or "hub" in self._hub_grace:
                self._check_hub()
        due = [HUB_CHECK if self._rehello_at is None else self._rehello_at - now]
        if joined and self._inbox.failed is None:  # not joined yet: no look is due
            due.append(self._next_hub_check - now)
        return min(due)

    def _check_hub(self) -> None:
        """Look at the uplink: the hub is gone once nobody has consumed it for HUB_GRACE
        seconds (:meth:`_counted`)."""
        if self._link is not None:
            self._link.consumers(self._uplink, self._counted)

    def _counted(self, consumers: int) -> None:
        if consumers:
            self._hub_grace.clear("hub")
            return
        now = time.monotonic()
        why = f"the hub at {self._shown} is gone: nobody consumed its queue for {HUB_GRACE:g} s"
        self._hub_grace.suspect("hub", why, now, again=False)
        for _, why in self._hub_grace.due(now):
            self._inbox.fail(PeerGone(why))

    def _medium_lost(self, detail: str) -> None:
        super()._medium_lost(detail)
        self._hub_grace.clear("hub")

    def _medium_back(self, detail: str, kept: bool = True) -> None:
        super()._medium_back(detail, kept)
        self._hub_grace.clear("hub")
        if self._session.state is State.OPEN:  # the hub may have lost track of us meanwhile
            self._rehello_at = self._asking_since = time.monotonic()

    def _medium_gone(self, exc: Exception) -> bool:
        self._inbox.fail(PeerGone(f"lost RabbitMQ for {OUTAGE_LIMIT:g} s: {exc}"))
        return False

    # -- user threads -----------------------------------------------------------------------

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
        if self._link is not None:
            with contextlib.suppress(TransportError, px.AMQPError):
                self._link.delete(queue, deadline_after(BYE_TIMEOUT))

    def _drop(self) -> None:
        """Close the connection without a goodbye (the hub notices our queue goes unread)."""
        self._closed, self._begun = True, False
        self._inbox.fail(PeerGone("channel is closed; call reconnect()"))
        if self._pub is not None:
            self._pub.close()
            self._pub = None
        if self._link is not None:
            self._link.stop(BYE_TIMEOUT)
            self._link = None

    def _release_queue(self) -> None:
        """Delete our queue (which ends consuming it); the connection is closed by _drop."""
        if self._link is not None:
            self._delete_queue(self._queue)

    def _abandon(self) -> None:
        self._release_queue()
        self._drop()

    def _say_goodbye(self) -> None:
        """Say goodbye to the hub (the bye names our session) and delete our queue."""
        if self._pub is not None and self._session.state is State.OPEN and not self._inbox.failed:
            goodbye = encode_message(None, {"session": self._session.session}, kind="bye")
            with contextlib.suppress(TransportError):  # hub or broker gone: nobody to tell
                deadline = deadline_after(BYE_TIMEOUT)
                sealer = self._sealer()
                self._pub.publish("", self._uplink, goodbye, CONTROL_CHUNK, deadline, sealer)
        self._release_queue()


class AmqpsChannel(AmqpChannel):
    """:class:`AmqpChannel` for ``amqps://`` URLs: the connection to the broker runs TLS."""

    protocol = "amqps"
