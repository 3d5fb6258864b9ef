"""A device's broker connection, driven by the process's one I/O thread (:mod:`.ioloop`): it
consumes the device's queue, publishes confirmed chunks handed from any thread, probes and
deletes queues, runs the device's bookkeeping (``tick``) on a timer, and rides out the broker
going away (medium lost / back). Every method whose name starts with ``_`` and every callback
runs on the I/O thread; a device whose connection fails touches no other device's."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import pika.exceptions as px
from pika.adapters.select_connection import SelectConnection
from pika.spec import Basic

from tensorwire.errors import PeerGone, SessionRefused, TransportError, TransportTimeout
from tensorwire.transports.amqp import ioloop
from tensorwire.transports.amqp.connection import (
    _QUEUE_ARGS,
    _widen_reads,
    failure,
    params_for,
)
from tensorwire.transports.amqp.settings import MAX_TICK, OUTAGE_LIMIT, PREFETCH, TICK, AmqpAddress
from tensorwire.transports.base import dial, remaining
from tensorwire.wire import CHUNK_HEADER_SIZE

log = logging.getLogger("tensorwire.transports.amqp")

_FIRST_DELAY, _MAX_DELAY = 0.02, 1.0  # seconds between reconnect attempts (doubling)
Done = Callable[[BaseException | None], None]


class Link:
    """One device's connection: ``on_message(channel, method, props, body)`` for each delivery
    of ``queue`` (consumed exclusively, acknowledged by the callee on ``channel``),
    ``tick()`` (seconds until it is due again; None: :data:`TICK`), and ``on_lost(detail)`` /
    ``on_back(detail)`` / ``on_gone(exc)`` (whether to keep trying after
    :data:`OUTAGE_LIMIT`) as :class:`~.consumer.Consumer` has them.

    The first connection is made (retried until ``deadline``) in the constructor, so its
    errors are the caller's.
    """

    def __init__(
        self,
        address: AmqpAddress,
        name: str,
        deadline: float | None,
        *,
        queue: str,
        on_message: Callable[[Any, Any, Any, bytes], None],
        tick: Callable[[], float | None],
        on_lost: Callable[[str], None],
        on_back: Callable[[str], None],
        on_gone: Callable[[Exception], bool],
    ) -> None:
        self._io = ioloop.shared()
        self._address, self._label, self._conn_name = address, name, f"tensorwire {name}"
        self._queue, self._on_message, self._tick = queue, on_message, tick
        self._on_lost, self._on_back, self._on_gone = on_lost, on_back, on_gone
        self.conn: SelectConnection | None = None
        self._ready = False  # connected, consuming, publishing channel open
        self._stopping = False
        self._pub: Any = None  # the confirming channel
        self._tag = 0  # the publishing channel's last delivery tag
        self._confirms: dict[int, tuple[ioloop.Waiter, bytes]] = {}  # tag: waiter, chunk head
        self._returned: set[int] = set()
        self._admin: Any = None  # probes and deletes: a refusal (404) closes it
        self._admin_opening = False
        self._admin_next = 0
        self._admin_ops: dict[int, tuple[Any, Done]] = {}
        self._queued: list[Callable[[], None]] = []  # work waiting for the connection
        self._timer: Any = None  # the next tick
        self._down_since: float | None = None
        self._delay = _FIRST_DELAY
        self.closed = ioloop.Waiter()  # set once stopped and the connection closed
        self.conn = dial(
            self._first,
            what=f"RabbitMQ at {address.where} (is it running?)",
            timeout=remaining(deadline),
        )

    # -- any thread ---------------------------------------------------------------------------

    def _first(self, deadline: float | None) -> SelectConnection:
        self._io.run_sync(
            lambda w: self._connect(deadline, lambda e: w.set() if e is None else w.fail(e)),
            None,
            "the AMQP I/O thread did not start the connection",
        )
        assert self.conn is not None
        return self.conn

    def start(self) -> None:
        """Start ticking (once the caller holds this link: the tick may use it)."""
        self._io.call(lambda: self._schedule(0.0))

    def run(self, fn: Callable[[ioloop.Waiter], None], deadline: float | None) -> Any:
        """``fn(waiter)`` on the I/O thread once the connection is up; what it sets on the
        waiter. ``TransportTimeout`` if the connection was not up by ``deadline``."""
        waiter = ioloop.Waiter()

        def attempt() -> None:
            if waiter.cancelled or waiter.done.is_set():
                return
            if self._stopping:
                waiter.fail(PeerGone("this endpoint is closed"))
            elif not self._ready:
                self._queued.append(attempt)
            else:
                waiter.started = True
                try:
                    fn(waiter)
                except BaseException as exc:  # the caller's to see
                    waiter.fail(exc)

        self._io.call(attempt)
        return waiter.wait(deadline, "the broker connection was not free in time")

    def publish(
        self, exchange: str, key: str, body: Callable[[], bytes], props: Any, deadline: float | None
    ) -> None:
        """Publish ``body()`` (made on the I/O thread) and wait for its confirm: pika's
        ``UnroutableError`` if it came back unroutable, ``NackError`` if refused,
        ``ChannelClosedByBroker`` if that closed the channel, another ``AMQPError`` if the
        connection was lost before the confirm."""
        self.run(lambda w: self._publish(exchange, key, body(), props, w), deadline)

    def delete(self, queue: str, deadline: float | None) -> None:
        """Delete ``queue`` (gone already is fine)."""
        self.run(
            lambda w: self._admin_op(
                lambda ch, cb: ch.queue_delete(queue, callback=cb), lambda _: w.set()
            ),
            deadline,
        )

    def stop(self, wait: float) -> None:
        """Close the connection (no reconnect after); wait up to ``wait`` s for it."""
        self._io.call(self._stop)
        with contextlib.suppress(Exception):
            self.closed.wait(time.monotonic() + wait, "closing")

    # -- the I/O thread -----------------------------------------------------------------------

    def say(self, exchange: str, key: str, body: bytes, props: Any) -> None:
        """Publish without waiting for the confirm (dropped while not connected)."""
        if self._ready:
            self._publish(exchange, key, body, props, ioloop.Waiter())

    def consumers(self, queue: str, counted: Callable[[int], None]) -> None:
        """``counted(n)``: how many consumers ``queue`` has (0 if it does not exist); not
        called if the connection is lost first."""

        def answered(result: Any) -> None:
            if isinstance(result, px.ChannelClosedByBroker):
                counted(0)
            elif not isinstance(result, BaseException):
                counted(result.method.consumer_count)

        self._admin_op(lambda ch, cb: ch.queue_declare(queue, passive=True, callback=cb), answered)

    def poke(self) -> None:
        """Run the tick now (something it looks at changed)."""
        if self._ready:
            self._schedule(0.0)

    def _connect(self, deadline: float | None, done: Done) -> None:
        """One attempt: connect, consume our queue, open the publishing channel; ``done(None)``
        once ready or ``done(error)``."""
        params = params_for(self._address, deadline, self._conn_name)
        finished = False

        def end(error: BaseException | None, conn: Any = None) -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            self._io.cancel(guard)
            if error is not None and conn is not None:
                self.conn = None
                with contextlib.suppress(Exception):
                    conn.close()
            done(error)

        def connected(result: Any) -> None:
            if isinstance(result, BaseException):
                end(failure(self._address, result))
                return
            conn: SelectConnection = result
            if self._stopping:
                conn.close()
                end(PeerGone("this endpoint is closed"))
                return
            _widen_reads(conn)
            self.conn = conn
            conn.add_on_close_callback(lambda c, reason: self._conn_closed(c, reason, end))
            parts = [2]

            def part() -> None:
                parts[0] -= 1
                if parts[0] == 0 and conn is self.conn:
                    self._ready, self._delay = True, _FIRST_DELAY
                    end(None)
                    queued, self._queued = self._queued, []
                    for job in queued:
                        job()

            def consuming(ch: Any) -> None:
                ch.add_on_close_callback(lambda c, reason: self._consuming_closed(reason, end))
                ch.queue_declare(
                    self._queue,
                    durable=True,
                    arguments=_QUEUE_ARGS,
                    callback=lambda _: ch.basic_qos(
                        prefetch_count=PREFETCH,
                        callback=lambda _: ch.basic_consume(
                            self._queue,
                            ioloop_guarded(self, self._on_message),
                            exclusive=True,
                            callback=lambda _: part(),
                        ),
                    ),
                )

            conn.channel(on_open_callback=consuming)
            self._open_publishing(conn, part)

        guard = self._io.later(
            (params.stack_timeout or 60.0) + 5.0,
            lambda: end(TransportError("setting up the connection took too long"), self.conn),
        )
        SelectConnection.create_connection(
            [params], on_done=ioloop.guarded(connected), custom_ioloop=self._io.ioloop
        )

    def _open_publishing(self, conn: SelectConnection, opened: Callable[[], None]) -> None:
        def confirming(ch: Any) -> None:
            ch.add_on_return_callback(self._on_return)
            ch.add_on_close_callback(self._pub_closed)
            self._pub, self._tag = ch, 0
            ch.confirm_delivery(self._on_confirm, callback=lambda _: opened())

        conn.channel(on_open_callback=confirming)

    def _publish(self, exchange: str, key: str, body: bytes, props: Any, w: ioloop.Waiter) -> None:
        if self._pub is None or not self._pub.is_open:
            raise px.ChannelWrongStateError("the publishing channel is not open")
        self._pub.basic_publish(exchange, key, body, props, mandatory=True)
        self._tag += 1
        self._confirms[self._tag] = (w, bytes(body[:CHUNK_HEADER_SIZE]))

    def _on_confirm(self, frame: Any) -> None:
        m = frame.method
        tags = (
            sorted(t for t in self._confirms if t <= m.delivery_tag)
            if m.multiple
            else [m.delivery_tag]
        )
        for tag in tags:
            entry = self._confirms.pop(tag, None)
            if entry is None:
                continue
            if isinstance(m, Basic.Nack):
                entry[0].fail(px.NackError([]))
            elif tag in self._returned:
                entry[0].fail(px.UnroutableError([]))
            else:
                entry[0].set()
            self._returned.discard(tag)

    def _on_return(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        """An unroutable chunk (its ack follows): the pending one with its header."""
        head = bytes(body[:CHUNK_HEADER_SIZE])
        tags = [t for t, (_, h) in self._confirms.items() if h == head]
        if tags or self._confirms:
            self._returned.add(min(tags or self._confirms))

    def _pub_closed(self, ch: Any, reason: Exception) -> None:
        """The broker closed the publishing channel (406: too large, say): its pending
        publishes fail with the reason, and a new one opens."""
        if ch is not self._pub:
            return
        self._pub = None
        self._fail_confirms(reason)
        conn = self.conn
        if isinstance(reason, px.ChannelClosedByBroker) and conn is not None and conn.is_open:
            self._ready = False
            self._open_publishing(conn, self._republishing)

    def _republishing(self) -> None:
        self._ready = True
        queued, self._queued = self._queued, []
        for job in queued:
            job()

    def _fail_confirms(self, error: Exception) -> None:
        confirms, self._confirms = self._confirms, {}
        self._returned.clear()
        for waiter, _ in confirms.values():
            waiter.fail(error)

    def _admin_op(self, start: Callable[[Any, Any], None], answered: Done) -> None:
        """``start(channel, callback)`` on the admin channel; ``answered(frame)``, or
        ``answered(exc)`` if it was refused (``ChannelClosedByBroker``) or the connection lost."""
        self._admin_next += 1
        n = self._admin_next
        self._admin_ops[n] = (start, answered)

        def go(ch: Any) -> None:
            def cb(frame: Any) -> None:
                if self._admin_ops.pop(n, None) is not None:
                    answered(frame)

            start(ch, cb)

        if self._admin is not None and self._admin.is_open:
            go(self._admin)
            return
        self._admin_ops[n] = (go, answered)
        if not self._admin_opening and self.conn is not None and self.conn.is_open:
            self._admin_opening = True
            self.conn.channel(on_open_callback=self._admin_opened)

    def _admin_opened(self, ch: Any) -> None:
        self._admin, self._admin_opening = ch, False
        ch.add_on_close_callback(self._admin_closed)
        for start, _ in list(self._admin_ops.values()):
            start(ch)

    def _admin_closed(self, ch: Any, reason: Exception) -> None:
        if ch is self._admin or self._admin is None:
            self._admin, self._admin_opening = None, False
            ops, self._admin_ops = self._admin_ops, {}
            for _, answered in ops.values():
                answered(reason)

    def _schedule(self, delay: float) -> None:
        self._io.cancel(self._timer)
        self._timer = self._io.later(delay, self._run_tick)

    def _run_tick(self) -> None:
        self._timer = None
        if not self._ready or self._stopping:
            return
        try:
            after = self._tick()
        except Exception:  # a bug in the bookkeeping must not end the device for good
            log.exception("amqp: %s: unexpected error; reconnecting", self._label)
            self._lose()
            return
        if self._timer is None:  # the tick did not poke itself
            self._schedule(TICK if after is None else min(max(after, 0.0), MAX_TICK))

    def _lose(self) -> None:
        """Close the connection to make a new one (its close callback reconnects)."""
        if self.conn is not None and self.conn.is_open:
            self.conn.close()

    def _consuming_closed(self, reason: Exception, end: Callable[..., None]) -> None:
        """The broker closed our consuming channel: without it this device hears nothing; a
        new connection sets it up again (and a refusal while setting up fails the attempt)."""
        if isinstance(reason, px.ChannelClosedByBroker):
            end(TransportError(f"setting up a new connection: {reason!r}"), self.conn)
            self._lose()

    def _conn_closed(self, conn: Any, reason: Exception, end: Callable[..., None]) -> None:
        if conn is not self.conn:
            return
        was_ready = self._ready
        self.conn, self._ready, self._pub, self._admin = None, False, None, None
        self._admin_opening = False
        self._io.cancel(self._timer)
        self._timer = None
        lost = reason if isinstance(reason, px.AMQPError) else px.StreamLostError(repr(reason))
        self._fail_confirms(lost)
        ops, self._admin_ops = self._admin_ops, {}
        for _, answered in ops.values():
            answered(lost)
        end(TransportError(f"the connection closed while setting up: {reason!r}"))
        if self._stopping:
            self.closed.set()
        elif was_ready:
            self._on_lost(f"lost RabbitMQ at {self._address.where} ({reason!r})")
            self._down_since = time.monotonic()
            self._io.later(self._delay, self._reconnect)

    def _reconnect(self) -> None:
        if self._stopping:
            return
        assert self._down_since is not None
        self._connect(None, self._reconnected)

    def _reconnected(self, error: BaseException | None) -> None:
        if self._stopping:
            self.closed.set()
            return
        assert self._down_since is not None
        now = time.monotonic()
        if error is None:
            down, self._down_since = now - self._down_since, None
            self._on_back(f"back on RabbitMQ at {self._address.where} after {down:.1f} s")
            self._schedule(0.0)  # what the new connection asks for (a hello again) is due now
            return
        if isinstance(error, SessionRefused) or now - self._down_since >= OUTAGE_LIMIT:
            if not isinstance(error, Exception) or not self._on_gone(
                error
                if isinstance(error, SessionRefused)
                else TransportTimeout(f"could not reach RabbitMQ at {self._address.where}: {error}")
            ):
                self._stop()
                return
            self._down_since = now
        log.debug("amqp: %s: reconnecting: %r", self._label, error)
        self._io.later(self._delay, self._reconnect)
        self._delay = min(self._delay * 2, _MAX_DELAY)

    def _stop(self) -> None:
        self._stopping, self._ready = True, False
        self._io.cancel(self._timer)
        self._timer = None
        queued, self._queued = self._queued, []
        for job in queued:
            job()  # each fails: stopping
        if self.conn is not None and self.conn.is_open:
            self.conn.close()
        elif self.conn is None or self.conn.is_closed:
            self._fail_confirms(PeerGone("this endpoint is closed"))
            self.closed.set()


def ioloop_guarded(link: Link, fn: Callable[..., None]) -> Callable[..., None]:
    """A delivery callback whose exception closes only ``link``'s connection (it reconnects):
    a bug must not end consuming for good, nor reach the loop every device shares."""

    def run(*args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("amqp: %s: unexpected error; reconnecting", link._label)
            link._lose()

    return run
