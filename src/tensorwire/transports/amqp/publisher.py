"""The confirming publisher of an AMQP endpoint: chunks handed, one at a time, to the thread of
the endpoint's one connection (its :class:`Consumer`), from any thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions as px

from tensorwire.errors import PeerGone, TransportError, TransportTimeout
from tensorwire.transports.amqp.connection import props
from tensorwire.transports.amqp.consumer import Consumer
from tensorwire.transports.amqp.link import Link
from tensorwire.transports.amqp.settings import RECONNECT_TIMEOUT
from tensorwire.transports.base import deadline_after, remaining
from tensorwire.transports.broker import sealed
from tensorwire.transports.security import Sealer
from tensorwire.wire import EncodedMessage, iter_chunks, new_message_id

log = logging.getLogger("tensorwire.transports.amqp")


class Publisher:
    """Publishes on a confirming channel of ``consumer``'s connection, opened on first use and
    again on each new connection; a chunk whose confirm did not come is published again once
    the connection is back (a receiver drops a repeated message id) until the send's deadline,
    or :data:`RECONNECT_TIMEOUT` without one. Messages from threads other than the
    connection's go one after another (:attr:`lock`); the connection's own thread (a callback)
    publishes at once, between their chunks."""

    def __init__(self, consumer: Consumer | None, sender: str, persistent: bool = True) -> None:
        self._consumer = consumer
        self._props = props(sender, persistent)
        self.lock = threading.Lock()
        self._ch: Any = None
        self._ch_conn: pika.BlockingConnection | None = None  # the connection _ch is on
        self._closed = False

    def channel(self, conn: pika.BlockingConnection) -> Any:
        """The confirming channel on ``conn`` (call on the connection's thread)."""
        if self._closed:
            raise PeerGone("this endpoint is closed")
        if self._ch is None or self._ch_conn is not conn or not self._ch.is_open:
            self._ch, self._ch_conn = conn.channel(), conn
            self._ch.confirm_delivery()
        return self._ch

    def run(self, op: Any, deadline: float | None) -> Any:
        """``op(channel)`` on the confirming channel, on the connection's thread."""
        assert self._consumer is not None
        return self._consumer.call(lambda conn: op(self.channel(conn)), deadline)

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
        (on the connection's thread, so the numbers follow the publishes); return once the
        broker confirmed all."""
        target = routing_key or exchange
        own = threading.current_thread() is self._consumer
        if not own:
            self.lock.acquire()
        try:
            for parts in iter_chunks(enc.frames(), new_message_id(), chunk):
                if remaining(deadline) == 0.0:
                    raise TransportTimeout(f"sending to {target!r} ran out of time")
                self._publish_chunk(exchange, routing_key, parts, sealer, deadline, target)
        finally:
            if not own:
                self.lock.release()

    def _publish_chunk(
        self,
        exchange: str,
        routing_key: str,
        parts: Sequence[Any],
        sealer: Sealer | None,
        deadline: float | None,
        target: str,
    ) -> None:
        limit = deadline  # a send without a deadline gets RECONNECT_TIMEOUT once the broker goes
        body: bytes | None = None
        delay = 0.05
        while True:

            def made() -> bytes:
                nonlocal body
                if body is None:
                    body = sealed(parts, sealer)
                return body

            try:
                self._send(exchange, routing_key, made, limit or deadline_after(RECONNECT_TIMEOUT))
                return
            except px.UnroutableError:
                raise PeerGone(f"no queue takes messages for {target!r}: its owner left") from None
            except px.NackError:
                raise TransportError(f"the broker refused a message for {target!r}") from None
            except px.ChannelClosedByBroker as exc:  # a new channel next time (channel())
                if exc.reply_code == 404:
                    raise PeerGone(f"{target!r} is gone: {exc.reply_text}") from None
                hint = " (lower chunk= in the URL)" if exc.reply_code == 406 else ""
                raise TransportError(
                    f"the broker closed the channel: {exc.reply_text}{hint}"
                ) from None
            except TransportError:  # no broker within the deadline, or closed
                raise
            except (px.AMQPError, OSError) as exc:  # the connection is lost: send it again
                if limit is None:
                    limit = deadline_after(RECONNECT_TIMEOUT)
                log.info("amqp: lost RabbitMQ sending to %r (%r); sending again", target, exc)
                if sealer is not None and body is not None:  # it may have arrived: a new number
                    body = sealer.reseal(body)
            left = remaining(limit)
            if left == 0.0:
                raise TransportTimeout(f"RabbitMQ did not come back in time to send to {target!r}")
            time.sleep(min(delay, left or 0.0))
            delay = min(delay * 2, 1.0)

    def _send(
        self, exchange: str, routing_key: str, body: Callable[[], bytes], deadline: float | None
    ) -> None:
        """Publish ``body()`` (made on the connection's thread) and wait for its confirm."""
        self.run(
            lambda ch: ch.basic_publish(exchange, routing_key, body(), self._props, mandatory=True),
            deadline,
        )

    def close(self) -> None:
        """No more publishes (the connection is the consumer's to close)."""
        self._closed = True


class LinkPublisher(Publisher):
    """:class:`Publisher` of a device's :class:`~.link.Link`, on the process's I/O thread."""

    def __init__(self, link: Link, sender: str, persistent: bool = True) -> None:
        super().__init__(None, sender, persistent)
        self._link = link

    def run(self, op: Any, deadline: float | None) -> Any:
        raise NotImplementedError("a device publishes with publish()")

    def _send(
        self, exchange: str, routing_key: str, body: Callable[[], bytes], deadline: float | None
    ) -> None:
        if self._closed:
            raise PeerGone("this endpoint is closed")
        self._link.publish(exchange, routing_key, body, self._props, deadline)
