"""The one broker connection of an AMQP endpoint: one thread that runs its deliveries, the
endpoint's bookkeeping and every other thread's publishes (pika's connections are not
thread-safe: :meth:`Consumer.call` hands work to it), and rides out the broker going away
(medium lost / back)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import pika
import pika.exceptions as px

from tensorwire.errors import PeerGone, TransportError, TransportTimeout
from tensorwire.transports.amqp.connection import close_quietly, connect_blocking, connect_once
from tensorwire.transports.amqp.settings import MAX_TICK, OUTAGE_LIMIT, TICK, AmqpAddress
from tensorwire.transports.base import dial, remaining

log = logging.getLogger("tensorwire.transports.amqp")
R = TypeVar("R")


class _Job:
    """Work for the connection's thread, and what came of it."""

    def __init__(self, fn: Callable[[pika.BlockingConnection], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.started = False
        self.cancelled = False  # its caller gave up before it started: skipped
        self.result: Any = None
        self.error: BaseException | None = None


class _Stopped(Exception):
    """The consumer was stopped while it reconnected (not an ``OSError``: ends ``dial``)."""


class Consumer(threading.Thread):
    """Owns the endpoint's one connection: runs its deliveries, ``tick()`` and the work other
    threads hand it (:meth:`call`) until :meth:`stop`.

    ``tick()`` returns how many seconds it may wait before it runs again (None: :data:`TICK`);
    between ticks the thread sleeps in the connection's poll, woken only by the broker or by
    work handed over, so a thousand idle endpoints in one process do not wake each other.

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
        tick: Callable[[], float | None],
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
        self._jobs: deque[_Job] = deque()
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
        wait = 0.0  # seconds until the next tick
        try:
            while not self._stopping:
                try:
                    self.conn.process_data_events(time_limit=wait)
                    self._run_jobs()
                    after = self._tick()
                    wait = TICK if after is None else min(max(after, 0.0), MAX_TICK)
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
                wait = 0.0  # what the new connection asks for (a hello again) is due now
        finally:
            close_quietly(self.conn)
            for job in self._jobs:
                job.error = PeerGone("this endpoint is closed")
                job.done.set()

    def call(self, fn: Callable[[pika.BlockingConnection], R], deadline: float | None) -> R:
        """``fn(connection)`` run on the connection's thread (at once if called from it); its
        result or its exception. While the broker is away it waits for the connection to come
        back; ``TransportTimeout`` if it has not started by ``deadline``."""
        if threading.current_thread() is self:
            return fn(self.conn)
        if self._stopping:
            raise PeerGone("this endpoint is closed")
        job = _Job(fn)
        self._jobs.append(job)
        if not self.is_alive() and not job.done.is_set():  # ended meanwhile: nobody runs it
            raise PeerGone("this endpoint is closed")
        with contextlib.suppress(px.AMQPError, OSError):  # lost: run once it is back
            self.conn.add_callback_threadsafe(self._run_jobs)
        if not job.done.wait(remaining(deadline)):
            job.cancelled = True
            if not job.started:
                raise TransportTimeout("the broker connection was not free in time")
            job.done.wait()  # begun: a publish ends by its confirm or a lost connection
        if job.error is not None:
            raise job.error
        return job.result

    def _run_jobs(self) -> None:
        """Run what other threads handed over (on this thread, the connection's)."""
        while self._jobs and not self._stopping:
            job = self._jobs.popleft()
            if job.cancelled:
                continue
            job.started = True
            try:
                job.result = job.fn(self.conn)
            except BaseException as exc:  # the caller's to see (a lost connection too)
                job.error = exc
            finally:
                job.done.set()

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
