"""One I/O thread that drives many paho clients through a selector, and runs their timers.

A thread per broker connection (paho's ``loop_start``) and another per channel for its timers
cost a process that simulates many devices its CPU: 100 channels were 300 threads queueing
for one interpreter lock, and at 2,000 devices in 20 processes a 1 MiB broadcast stalled the
machine (a load average of 1,400). So a process's channels share one loop (:func:`shared`),
each keeping its own connection, session, TLS and inbox; a hub's connection runs a loop of
its own (``NetworkLoop()``), so that no client in its process can hold it up. A forked child
makes its own loop; the last connection to leave a loop ends its thread.

paho's external-loop interface: the loop watches ``socket()`` and calls ``loop_read``,
``loop_write`` (while ``want_write()``) and ``loop_misc`` (keep-alive, every second);
``on_socket_register_write`` from any thread says there is something to send. A lost
connection is dialled again, with backoff, on a short-lived dialer thread, so that a broker
that does not answer holds up no other connection.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from tensorwire.transports.timer_heap import TimerHeap

log = logging.getLogger("tensorwire.transports.mqtt")

MISC_EVERY_S = 1.0  # how often every connection's keep-alive is looked at (paho's own: 1 s)
REDIAL_S = (0.1, 2.0)  # first and longest wait before dialling a lost connection again
IDLE_WAIT_S = 5.0  # the longest the loop sleeps with nothing due (a bound, not a poll)


class Driven(Protocol):
    """What the loop drives: a paho client and what its owner does with a lost connection."""

    @property
    def client(self) -> Any: ...  # a paho.mqtt.client.Client

    @property
    def connects(self) -> int:
        """CONNACKs so far: a new one resets the redial backoff."""
        ...

    @property
    def closing(self) -> bool:
        """Being closed: not dialled again, dropped once its socket is gone."""
        ...


class Timer:
    """A call the loop makes at its time unless cancelled first (from any thread)."""

    __slots__ = ("cancelled", "fn", "loop")

    def __init__(self, loop: NetworkLoop, fn: Callable[[], None]) -> None:
        self.loop, self.fn, self.cancelled = loop, fn, False

    def cancel(self) -> None:
        self.cancelled = True  # one already taken from the heap, due, is skipped
        with self.loop._lock:
            self.loop._timers.discard(self)  # not left in the heap until its time


class _Entry:
    """The loop's record of one driven connection (its thread's alone, but for ``done``)."""

    __slots__ = (
        "conn",
        "delay",
        "dialing",
        "done",
        "events",
        "finish",
        "redial",
        "seen_connects",
        "sock",
    )

    def __init__(self, conn: Driven) -> None:
        self.conn = conn
        self.sock: Any = None  # the socket registered with the selector
        self.events = 0
        self.dialing = False  # the dialer thread owns the client meanwhile
        self.redial: Timer | None = None
        self.delay = REDIAL_S[0]
        self.seen_connects = conn.connects
        self.finish: Callable[[Any], None] | None = None  # what ends its connection, once
        self.done = threading.Event()  # set once the loop has let go of it


class NetworkLoop:
    """A selector over paho clients' sockets, timers, and the thread that runs them, started
    by the first :meth:`add` and ended when the last connection has gone."""

    def __init__(self, name: str = "tensorwire-mqtt-loop") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._entries: dict[Driven, _Entry] = {}  # under _lock: what it drives or will
        self._pending: set[Driven] = set()  # under _lock: look at these (something to send)
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._timers: TimerHeap[Timer] = TimerHeap()  # under _lock
        self._woken = False  # under _lock: a wake-up byte is on its way
        self._thread: threading.Thread | None = None
        self._ended = False  # under _lock: the thread ended or is ending, for good
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._dials: collections.deque[_Entry] = collections.deque()  # under _lock
        self._dialer: threading.Thread | None = None  # under _lock
        self._ready: set[_Entry] = set()  # TLS sockets holding decrypted bytes: read again

    # -- any thread ----------------------------------------------------------------------

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def add(self, conn: Driven) -> bool:
        """Drive ``conn`` (connected by its owner, its CONNECT queued); False if this loop has
        ended (take another)."""
        with self._lock:
            if self._ended:
                return False
            self._entries[conn] = _Entry(conn)
            self._pending.add(conn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._wake()
        return True

    def poke(self, conn: Driven) -> None:
        """``conn`` has something to send (paho's ``on_socket_register_write``)."""
        with self._lock:
            self._pending.add(conn)
            if not self.on_thread():
                self._wake()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop's thread, next."""
        with self._lock:
            self._jobs.append(fn)
            if not self.on_thread():
                self._wake()

    def call_at(self, when: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` on the loop's thread at ``when`` (monotonic seconds)."""
        timer = Timer(self, fn)
        with self._lock:
            self._timers.arm(timer, when)
            if not self.on_thread():
                self._wake()
        return timer

    def remove(self, conn: Driven, finish: Callable[[Any], None], wait: float | None) -> bool:
        """Let go of ``conn`` (already ``closing``): ``finish(client)`` runs on the loop's
        thread first (a DISCONNECT, or a shutdown), then the loop drops it once its socket is
        closed; waits up to ``wait`` seconds for that (None: no wait, as on the loop's own
        thread). True once dropped."""
        with self._lock:
            entry = self._entries.get(conn)
        if entry is None:
            return True
        self.call_soon(lambda: self._closing(entry, finish))
        if wait is None or self.on_thread():
            return entry.done.is_set()
        if not entry.done.wait(wait):
            self.call_soon(lambda: self._drop(entry))  # it would not close: drop it as it is
            entry.done.wait(wait)
        return entry.done.is_set()

    def _wake(self) -> None:
        """Under _lock: make the loop's select return (an ended loop's is closed: a late
        caller's job is not run, its connections are gone)."""
        if not self._woken and not self._ended:
            self._woken = True
            with contextlib.suppress(BlockingIOError):  # full: a byte is waiting anyway
                self._wake_w.send(b"\0")

    # -- the loop's thread ---------------------------------------------------------------

    def _run(self) -> None:
        next_misc = time.monotonic() + MISC_EVERY_S
        try:
            while True:
                with self._lock:
                    if not self._entries and not self._jobs:
                        self._ended = True
                        return
                    soonest = self._timers.soonest()
                    due = next_misc if soonest is None else soonest
                    busy = self._ready or self._pending or self._jobs  # queued on this thread
                now = time.monotonic()
                wait = 0.0 if busy else min(max(min(due, next_misc) - now, 0.0), IDLE_WAIT_S)
                events = self._selector.select(wait)
                for key, mask in events:
                    if key.data is None:
                        self._drain_wake()
                    else:
                        self._serve(key.data, mask)
                for entry in list(self._ready):
                    self._ready.discard(entry)
                    self._serve(entry, selectors.EVENT_READ)
                self._run_jobs()
                self._run_timers()
                if time.monotonic() >= next_misc:
                    next_misc = time.monotonic() + MISC_EVERY_S
                    self._misc()
        except BaseException:
            log.exception("mqtt: the network loop failed; its connections are lost")
            with self._lock:
                self._ended = True
            raise
        finally:
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)
        with self._lock:
            self._woken = False

    def _run_jobs(self) -> None:
        """The jobs queued, and a look at every connection poked since the last round."""
        with self._lock:
            pending, self._pending = self._pending, set()
            jobs = list(self._jobs)
            self._jobs.clear()
            entries = [e for c in pending if (e := self._entries.get(c)) is not None]
        for entry in entries:
            self._sync(entry)
        for job in jobs:
            run_safely(job, "a job on the network loop")

    def _run_timers(self) -> None:
        with self._lock:
            due = self._timers.due(time.monotonic())
        for timer in due:
            if not timer.cancelled:
                run_safely(timer.fn, "a timer on the network loop")

    def _serve(self, entry: _Entry, mask: int) -> None:
        """Read and write what the selector says a connection's socket is ready for."""
        client, sock = entry.conn.client, entry.sock
        if entry.dialing or sock is None or client.socket() is not sock:
            self._sync(entry)  # an event of a socket since closed
            return
        if mask & selectors.EVENT_READ:
            run_safely(client.loop_read, "reading from the broker")
            pending = getattr(sock, "pending", None)  # TLS: decrypted bytes select cannot see
            if pending is not None and client.socket() is sock and pending() > 0:
                self._ready.add(entry)
        if mask & selectors.EVENT_WRITE and client.socket() is sock:
            run_safely(client.loop_write, "writing to the broker")
        self._sync(entry)

    def _misc(self) -> None:
        with self._lock:
            entries = list(self._entries.values())
        for entry in entries:
            if not entry.dialing and entry.sock is not None:
                run_safely(entry.conn.client.loop_misc, "the keep-alive")
                self._sync(entry)

    def _sync(self, entry: _Entry) -> None:
        """Make the selector watch what the client's socket needs now; dial a lost connection
        again (with backoff), or drop a closed one."""
        if not entry.dialing and not entry.done.is_set():
            run_safely(lambda: self._sync_now(entry), "watching a connection")

    def _sync_now(self, entry: _Entry) -> None:
        conn, client = entry.conn, entry.conn.client
        if entry.finish is not None and client.socket() is not None:
            finish, entry.finish = entry.finish, None
            run_safely(lambda: finish(client), "closing a connection")
        sock = client.socket()
        if sock is not entry.sock:
            self._unwatch(entry)
            if sock is not None:
                self._watch(entry, sock)
        if sock is None:
            self._ready.discard(entry)
            if conn.closing:
                self._drop(entry)
            elif entry.redial is None:
                if conn.connects != entry.seen_connects:  # it got through since the last dial
                    entry.seen_connects, entry.delay = conn.connects, REDIAL_S[0]
                entry.redial = self.call_at(
                    time.monotonic() + entry.delay, lambda: self._dial(entry)
                )
                entry.delay = min(entry.delay * 2, REDIAL_S[1])
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.want_write() else 0)
        if events != entry.events:
            self._selector.modify(sock, events, entry)
            entry.events = events

    def _watch(self, entry: _Entry, sock: Any) -> None:
        events = selectors.EVENT_READ | (
            selectors.EVENT_WRITE if entry.conn.client.want_write() else 0
        )
        try:
            self._selector.register(sock, events, entry)
        except KeyError:  # its number was a socket's closed without the loop knowing: stale
            stale = self._selector.get_key(sock)
            self._selector.unregister(stale.fileobj)
            if isinstance(stale.data, _Entry):
                stale.data.sock, stale.data.events = None, 0
            self._selector.register(sock, events, entry)
        entry.sock, entry.events = sock, events

    def _unwatch(self, entry: _Entry) -> None:
        if entry.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(entry.sock)
            entry.sock, entry.events = None, 0

    def socket_closing(self, conn: Driven, sock: Any) -> None:
        """paho is about to close ``sock`` (``on_socket_close``): on the loop's thread, stop
        watching it now, before its number can be another socket's."""
        if not self.on_thread():
            return  # the dialer's: nothing of it is watched meanwhile
        with self._lock:
            entry = self._entries.get(conn)
        if entry is not None and entry.sock is sock:
            self._unwatch(entry)
            self._ready.discard(entry)

    def _closing(self, entry: _Entry, finish: Callable[[Any], None]) -> None:
        if entry.redial is not None:
            entry.redial.cancel()
            entry.redial = None
        entry.finish = finish
        self._sync(entry)  # dropped now if there is no socket left; else once it has gone

    def _drop(self, entry: _Entry) -> None:
        if entry.done.is_set():
            return
        self._unwatch(entry)
        self._ready.discard(entry)
        if entry.redial is not None:
            entry.redial.cancel()
        sock = None if entry.dialing else entry.conn.client.socket()
        if sock is not None:  # it would not close (a DISCONNECT the broker never took)
            with contextlib.suppress(OSError):
                sock.close()
        with self._lock:
            self._entries.pop(entry.conn, None)
            self._pending.discard(entry.conn)
            if not self._entries:
                _forget(self)  # nobody takes it from now on; its thread ends
        entry.done.set()

    # -- dialling --------------------------------------------------------------------------

    def _dial(self, entry: _Entry) -> None:
        entry.redial = None
        if entry.done.is_set() or entry.conn.client.socket() is not None:
            return
        if entry.conn.closing:
            self._drop(entry)
            return
        entry.dialing = True
        with self._lock:
            self._dials.append(entry)
            if self._dialer is None:
                self._dialer = threading.Thread(
                    target=self._dial_all, name=f"{self._name}-dialer", daemon=True
                )
                self._dialer.start()

    def _dial_all(self) -> None:
        """The dialer thread: dial the connections due, one after another, then end."""
        while True:
            with self._lock:
                if not self._dials:
                    self._dialer = None
                    return
                entry = self._dials.popleft()
            try:
                entry.conn.client.reconnect()
            except Exception as exc:  # refused, unreachable, TLS: tried again after a wait
                log.debug("mqtt: dialling the broker again failed: %s", exc)
            self.call_soon(lambda e=entry: self._dialled(e))  # type: ignore[misc]

    def _dialled(self, entry: _Entry) -> None:
        entry.dialing = False
        self._sync(entry)


def run_safely(job: Callable[[], Any], where: str) -> None:
    """Run ``job``; a bug in it is logged and does not end the loop."""
    try:
        job()
    except Exception:
        log.exception("mqtt: %s failed", where)


_registry_lock = threading.Lock()
_shared: dict[int, NetworkLoop] = {}  # by process id: a forked child makes its own


def shared() -> NetworkLoop:
    """This process's loop for channels (made on first use)."""
    with _registry_lock:
        loop = _shared.get(os.getpid())
        if loop is None:
            loop = _shared[os.getpid()] = NetworkLoop()
        return loop


def _forget(loop: NetworkLoop) -> None:
    """Under ``loop._lock``, with no connection left: it takes none from now on."""
    loop._ended = True
    with _registry_lock:
        if _shared.get(os.getpid()) is loop:
            del _shared[os.getpid()]
