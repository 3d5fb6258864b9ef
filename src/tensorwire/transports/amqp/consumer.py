"""The consuming connection of an AMQP endpoint: one thread that runs its deliveries and the
endpoint's bookkeeping, and rides out the broker going away (medium lost / back)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import pika
import pika.exceptions as px

from tensorwire.errors import TransportError
from tensorwire.transports.amqp.connection import close_quietly, connect_blocking, connect_once
from tensorwire.transports.amqp.settings import OUTAGE_LIMIT, TICK, AmqpAddress
from tensorwire.transports.base import dial

log = logging.getLogger("tensorwire.transports.amqp")


class _Stopped(Exception):
    """The consumer was stopped while it reconnected (not an ``OSError``: ends ``dial``)."""


class Consumer(threading.Thread):
    """Owns the consuming connection: runs its deliveries and ``tick()`` until :meth:`stop`.

    The first connection is made (retried until ``deadline``) and ``setup(conn)`` run on it in
    the constructor, so their errors are the caller's. When the broker connection is lost it
    calls ``on_lost(detail)``, reconnects with backoff, runs ``setup`` on the new connection and
    calls ``on_back(detail)``; after :data:`OUTAGE_LIMIT` seconds in vain, ``on_gone(exc)``,
    which says whether to keep trying.
    """

    def __init__(
        self,
        address: AmqpAddress,
        name: str,
        deadline: float | None,
        *,
        setup: Callable[[pika.BlockingConnection], None],
        tick: Callable[[], None],
        on_lost: Callable[[str], None],
        on_back: Callable[[str], None],
        on_gone: Callable[[Exception], bool],
    ) -> None:
        super().__init__(name=f"tensorwire-amqp-{name}", daemon=True)
        self._label = name
        self._address = address
        self._conn_name = f"tensorwire {name}"
        self._setup = setup
        self._tick = tick
        self._on_lost = on_lost
        self._on_back = on_back
        self._on_gone = on_gone
        self._stopping = False
        self.conn = connect_blocking(address, deadline, self._conn_name)
        try:
            setup(self.conn)
        except BaseException:
            close_quietly(self.conn)
            raise

    def _reopen(self, deadline: float | None) -> pika.BlockingConnection:
        """One attempt at a new connection, set up; every failure is for ``dial`` to retry."""
        if self._stopping:
            raise _Stopped
        conn = connect_once(self._address, deadline, self._conn_name)
        try:
            self._setup(conn)
        except (px.AMQPError, OSError) as exc:
            close_quietly(conn)
            raise TransportError(f"setting up a new connection: {exc!r}") from None
        return conn

    def run(self) -> None:
        try:
            while not self._stopping:
                try:
                    self.conn.process_data_events(time_limit=TICK)
                    self._tick()
                    continue
                except (px.AMQPError, OSError) as exc:
                    lost: Exception = exc
                except Exception as exc:  # a bug in a callback must not end consuming for good
                    log.exception("amqp: %s: unexpected error; reconnecting", self._label)
                    lost = exc
                if self._stopping:
                    return
                close_quietly(self.conn)
                self._reconnect(lost)
        finally:
            close_quietly(self.conn)

    def _reconnect(self, lost: Exception) -> None:
        self._on_lost(f"lost RabbitMQ at {self._address.where} ({lost!r})")
        started = time.monotonic()
        while True:
            try:
                self.conn = dial(
                    self._reopen, what=f"RabbitMQ at {self._address.where}", timeout=OUTAGE_LIMIT
                )
                break
            except _Stopped:
                self._stopping = True
                return
            except TransportError as exc:
                if not self._on_gone(exc):
                    self._stopping = True
                    return
        down = time.monotonic() - started
        self._on_back(f"back on RabbitMQ at {self._address.where} after {down:.1f} s")

    def stop(self) -> None:
        """Stop consuming and close the connection (from the thread itself); wait for it."""
        self._stopping = True
        with contextlib.suppress(px.AMQPError, OSError):  # connection already gone
            self.conn.add_callback_threadsafe(lambda: None)  # wake process_data_events now
        if threading.current_thread() is not self and self.is_alive():
            self.join(timeout=10)
