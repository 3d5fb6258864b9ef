"""The I/O thread of a quic:// endpoint: one UDP socket and the QUIC connections on it."""

from __future__ import annotations

import contextlib
import functools
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from aioquic.buffer import Buffer
from aioquic.quic import events
from aioquic.quic.packet import QuicPacketType, pull_quic_header

from tensorwire.errors import TransportTimeout
from tensorwire.transports.base import _log_limited, remaining
from tensorwire.transports.quic.compat import host_connection_ids, peer_close, terminated
from tensorwire.transports.quic.connection import APP_REFUSED, Connection
from tensorwire.transports.quic.messages import SendJob
from tensorwire.transports.sockets import drain, wake, waker
from tensorwire.transports.timer_heap import TimerHeap
from tensorwire.wire import EncodedMessage

log = logging.getLogger("tensorwire.transports.quic")
# aioquic logs each error a stray packet causes (thousands in a join storm: "Packet contains
# no CRYPTO frame") as a WARNING of its "quic" logger; with no handler configured, Python's
# last resort printed each raw to stderr. They still reach an application's own handlers;
# the hub reports refusals itself, a line per kind every few seconds.
logging.getLogger("quic").addHandler(logging.NullHandler())

RECV_BATCH = 256  # datagrams read per wake-up before sending what they call for
RECV_EVERY = 16
"""Datagrams sent between two reads of what came in meanwhile: a hub sending to thousands of
peers for a whole turn let its socket's buffer overflow (12 % of the datagrams 2,000 clients
sent it were dropped: acknowledgements and replies, each loss then waiting for a timeout)."""
SOCKET_BUFFER = 8 << 20  # bytes of kernel socket buffer asked for, each direction
TICK_EVERY = 0.25  # seconds: the longest the loop sleeps while a tick is set

Accept = Callable[[Any, Any, float], "Connection | None"]
"""``accept(header, addr, now)``: a hub's new connection for a client's Initial, or None."""


class Engine:
    """A UDP socket and the thread that runs its QUIC connections (all aioquic calls happen
    on it). A hub's engine accepts new connections (``accept``); a process's channels to one
    hub share one (:mod:`.endpoint`)."""

    def __init__(self, sock: socket.socket, name: str, accept: Accept | None = None) -> None:
        self.sock = sock
        self.name = name
        self.accept = accept
        self.connections: dict[bytes, Connection] = {}  # by every connection id of ours
        self.tick: Callable[[float], None] | None = None  # per-turn housekeeping
        self._calls: deque[Callable[[], None]] = deque()
        self._dirty: dict[Connection, None] = {}  # touched since the last turn, in order
        self._timers: TimerHeap[Connection] = TimerHeap()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = waker()
        sock.setblocking(False)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._selector.register(sock, selectors.EVENT_READ, "sock")
        self._stopping = False
        self._sent_unread = 0  # datagrams sent since the socket was last read
        # told when the kernel says nobody listens at the peer's port (a connected socket's)
        self.on_refused: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread (now, if this is it)."""
        if self.in_loop:
            fn()
            return
        self._calls.append(fn)
        wake(self._wake_w)

    def add(self, connection: Connection) -> None:
        """Route ``connection``'s datagrams here and serve it from now on (I/O thread)."""
        for cid in host_connection_ids(connection.conn):
            self._route_to(cid, connection)
        connection.wake = functools.partial(self._touch, connection)
        self._touch(connection)

    def _route_to(self, cid: bytes, connection: Connection) -> None:
        self.connections[cid] = connection
        connection.cids.add(cid)

    def remove(self, connection: Connection) -> None:
        for cid in connection.cids:
            if self.connections.get(cid) is connection:
                del self.connections[cid]
        connection.cids.clear()
        self._timers.discard(connection)
        self._dirty.pop(connection, None)

    def _touch(self, connection: Connection) -> None:
        """``connection`` may have something to send: serve it this turn."""
        self._dirty[connection] = None

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        wake(self._wake_w)
        if self._thread.is_alive() and not self.in_loop:
            self._thread.join(timeout)

    # -- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                try:
                    self._turn()
                except Exception as exc:  # never let one failure stop every peer's I/O
                    _log_limited(f"quic {self.name}", f"quic: {self.name}: {exc!r}")
                    log.debug("quic: %s failed", self.name, exc_info=True)
                    time.sleep(0.05)
        finally:
            for _ in range(len(self._calls)):  # last words: a CONNECTION_CLOSE, say
                with contextlib.suppress(Exception):
                    self._calls.popleft()()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()
            self.sock.close()

    def _turn(self) -> None:
        while self._calls:
            self._calls.popleft()()
        now = time.monotonic()
        for connection in self._timers.due(now):
            connection.conn.handle_timer(now)
            self._dirty[connection] = None
        if self.tick is not None:
            self.tick(now)
        self._serve()
        wait = self._next_wake(now)  # epoll rounds it up to whole milliseconds
        for key, _ in self._selector.select(wait):
            if key.data == "wake":
                drain(self._wake_r)
            else:
                self._receive()

    def _serve(self) -> None:
        """Events and datagrams of the connections touched since the last turn (never the
        others: a turn costs what happened in it, not the number of connections), then their
        timers re-armed."""
        while self._dirty:
            batch, self._dirty = self._dirty, {}
            for connection in batch:
                self._events(connection)
            self.transmit(batch)
            for connection in batch:
                if connection.cids:
                    self._timers.arm(connection, connection.conn.get_timer())

    def _next_wake(self, now: float) -> float | None:
        if self._calls or self._dirty:
            return 0.0
        soonest = self._timers.soonest()
        wait = None if soonest is None else max(soonest - now, 0.0)
        if self.tick is not None:
            wait = TICK_EVERY if wait is None else min(wait, TICK_EVERY)
        return wait

    def _receive(self) -> None:
        self._sent_unread = 0
        now = time.monotonic()
        for _ in range(RECV_BATCH):
            try:
                data, addr = self.sock.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:  # ICMP: nobody listens at the peer's port
                self._refused()
                continue
            except OSError:
                break
            connection = self._route(data, addr, now)
            if connection is None:
                continue
            connection.conn.receive_datagram(data, addr, now=now)
            self._dirty[connection] = None

    def _refused(self) -> None:
        if self.on_refused is not None:
            self.on_refused()

    def _route(self, data: bytes, addr: Any, now: float) -> Connection | None:
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=8)
        except ValueError:
            return None  # not QUIC: dropped, as QUIC requires
        connection = self.connections.get(header.destination_cid)
        new = header.packet_type == QuicPacketType.INITIAL and len(data) >= 1200
        if connection is None and self.accept is not None and new:
            connection = self.accept(header, addr, now)
            if connection is not None:
                self._route_to(header.destination_cid, connection)
                self.add(connection)
        return connection

    def _events(self, connection: Connection) -> None:
        conn = connection.conn
        for _ in range(100_000):
            event = conn.next_event()
            if event is None:
                break
            if isinstance(event, events.ConnectionIdIssued):
                self._route_to(event.connection_id, connection)
            elif isinstance(event, events.ConnectionIdRetired):
                self.connections.pop(event.connection_id, None)
                connection.cids.discard(event.connection_id)
            connection.handle(event)
        close = peer_close(conn)
        if close is not None and not connection.closed.is_set():
            connection.handle(close)
        connection.pump()

    def transmit(self, connections: Iterable[Connection]) -> None:
        """Send what ``connections`` have to send now (on the I/O thread)."""
        for connection in connections:
            try:  # the time now: reads in between fed it datagrams of later times
                datagrams = connection.conn.datagrams_to_send(now=time.monotonic())
            except Exception as exc:  # a bug for one connection: close it, serve the rest
                log.debug("quic: %s: cannot build packets", self.name, exc_info=True)
                connection.close(APP_REFUSED, f"internal error: {exc!r}")
                continue
            for data, addr in datagrams:
                self._sent_unread += 1
                if self._sent_unread >= RECV_EVERY:
                    self._receive()
                try:
                    self.sock.sendto(data, addr)
                except (BlockingIOError, InterruptedError):
                    break  # the socket buffer is full: as if lost; QUIC recovers
                except ConnectionRefusedError:
                    self._refused()
                except OSError as exc:
                    _log_limited(f"quic send {self.name}", f"quic: {self.name}: send: {exc}")
            if connection.closed.is_set() and terminated(connection.conn):
                self.remove(connection)

    # -- called from other threads -------------------------------------------------------

    def run_send(self, connection: Connection, enc: EncodedMessage, deadline: float | None) -> None:
        """Send one message on ``connection`` by ``deadline``: TransportTimeout (the stream is
        reset, the connection stays) or PeerGone."""
        job = SendJob.of(enc)
        if self.in_loop:  # a callback of ours sends: queue it, never wait on ourselves
            connection.submit(job)
            if job.error is not None:
                raise job.error
            return
        self.call(lambda: connection.submit(job))
        if not job.done.wait(remaining(deadline)):
            self.call(lambda: connection.cancel(job))
            raise TransportTimeout(f"send of {job.nbytes} bytes timed out")
        if job.error is not None:
            raise job.error

    def flush(self, connections: list[Connection], timeout: float) -> None:
        """Wait until what was sent on ``connections`` is acknowledged, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping:
            if all(c.flushed for c in connections):
                return
            time.sleep(0.005)

    def close(
        self,
        connections: Callable[[], Iterable[Connection]],
        code: int,
        reason: str,
        timeout: float,
    ) -> None:
        """Close the ``connections()`` of the moment on the I/O thread and send their
        CONNECTION_CLOSE (waiting ``timeout`` seconds at most for it)."""
        done = threading.Event()

        def close() -> None:
            closing = list(connections())
            for connection in closing:
                connection.close(code, reason)
            self.transmit(closing)
            done.set()

        self.call(close)
        done.wait(timeout)
