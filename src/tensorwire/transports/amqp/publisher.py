"""The confirming publisher connection of an AMQP endpoint, shared by threads under a lock."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pika
import pika.exceptions as px

from tensorwire.errors import PeerGone, TransportError, TransportTimeout
from tensorwire.transports.amqp.connection import close_quietly, connect_blocking, props
from tensorwire.transports.amqp.settings import KEEPALIVE, RECONNECT_TIMEOUT, AmqpAddress
from tensorwire.transports.base import deadline_after, remaining
from tensorwire.transports.broker import sealed
from tensorwire.transports.security import Sealer
from tensorwire.wire import EncodedMessage, iter_chunks, new_message_id

log = logging.getLogger("tensorwire.transports.amqp")


class Publisher:
    """A confirming publisher connection, shared by threads under :attr:`lock`.

    Opened on first use and again whenever the broker connection is lost; a chunk whose
    confirm did not come is published again on the new connection (a receiver drops a repeated
    message id) until the send's deadline, or :data:`RECONNECT_TIMEOUT` without one.
    """

    def __init__(self, address: AmqpAddress, name: str, sender: str) -> None:
        self._address = address
        self._name = name
        self._props = props(sender)
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

    def channel(self, deadline: float | None) -> Any:
        """The confirming channel, (re)connected until ``deadline``; call with :attr:`lock` held."""
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
        sealer: Sealer | None = None,
    ) -> None:
        """Publish ``enc`` as chunks of ``chunk`` bytes, each sealed if there is a ``sealer``
        (as it goes, so the numbers follow the publishes); return once the broker confirmed
        all."""
        target = routing_key or exchange
        with self.lock:
            self._last_used = time.monotonic()
            for parts in iter_chunks(enc.frames(), new_message_id(), chunk):
                if remaining(deadline) == 0.0:
                    raise TransportTimeout(f"sending to {target!r} ran out of time")
                body = sealed(parts, sealer)
                self._publish_chunk(exchange, routing_key, body, sealer, deadline, target)

    def _publish_chunk(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        sealer: Sealer | None,
        deadline: float | None,
        target: str,
    ) -> None:
        limit = deadline  # a send without a deadline gets RECONNECT_TIMEOUT once the broker goes
        delay = 0.05
        while True:
            try:
                ch = self.channel(limit)
                ch.basic_publish(exchange, routing_key, body, self._props, mandatory=True)
                return
            except px.UnroutableError:
                raise PeerGone(f"no queue takes messages for {target!r}: its owner left") from None
            except px.NackError:
                raise TransportError(f"the broker refused a message for {target!r}") from None
            except px.ChannelClosedByBroker as exc:
                self._ch = None
                if exc.reply_code == 404:
                    raise PeerGone(f"{target!r} is gone: {exc.reply_text}") from None
                hint = " (lower chunk= in the URL)" if exc.reply_code == 406 else ""
                raise TransportError(
                    f"the broker closed the channel: {exc.reply_text}{hint}"
                ) from None
            except TransportError:  # no broker within the deadline, a refusal, or closed
                raise
            except (px.AMQPError, OSError) as exc:  # the connection is lost: send it again
                close_quietly(self._conn)
                self._conn = self._ch = None
                if limit is None:
                    limit = deadline_after(RECONNECT_TIMEOUT)
                log.info("amqp: lost RabbitMQ sending to %r (%r); sending again", target, exc)
                if sealer is not None:  # the first may have arrived: a new number, not a replay
                    body = sealer.reseal(body)
            left = remaining(limit)
            if left == 0.0:
                raise TransportTimeout(f"RabbitMQ did not come back in time to send to {target!r}")
            time.sleep(min(delay, left or 0.0))
            delay = min(delay * 2, 1.0)

    def keepalive(self) -> None:
        """Let an idle connection answer heartbeats; skipped while another thread publishes."""
        idle = time.monotonic() - self._last_used
        if idle < self._keepalive or not self.lock.acquire(blocking=False):
            return
        try:
            if self._conn is not None and self._conn.is_open:
                self._conn.process_data_events(0)
            self._last_used = time.monotonic()
        except (px.AMQPError, OSError):  # lost: the next publish reconnects
            close_quietly(self._conn)
            self._conn = self._ch = None
        finally:
            self.lock.release()

    def close(self) -> None:
        with self.lock:
            self._closed = True
            close_quietly(self._conn)
            self._conn = self._ch = None
