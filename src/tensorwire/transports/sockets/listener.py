"""A listening stream socket that gives each connection a thread of its own once it speaks,
with guards against floods of connections that never say hello.

A connection that has sent nothing yet costs a file descriptor and a slot in the accepting
thread's selector, not a thread: thousands of idle ones cannot keep a device out. Bounds:

- at most :data:`MAX_SILENT` connections (or a quarter of the process's descriptor limit,
  if less) wait silent at once, and at most
  :data:`MAX_SILENT_PER_SOURCE` from one address; past either, the oldest silent one (of that
  address) is closed to make room for the new one, so whoever reopens idle sockets only
  pushes out their own, and a device, which speaks at once, gets through;
- a connection silent for ``silent_timeout`` seconds (default :data:`SILENT_S`) is closed;
- at most :data:`MAX_HANDSHAKES` connections run their handshake at once (a thread each, up
  to the handshake's own deadline); connections that have spoken wait for a turn, the oldest
  dropped past :data:`MAX_SILENT` waiting.
"""

from __future__ import annotations

import errno
import logging
import resource
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from tensorwire.errors import TransportError, WireError
from tensorwire.transports.sockets.tuning import shutdown
from tensorwire.transports.sockets.waiting_room import WaitingRoom
from tensorwire.transports.sockets.waker import drain, wake, waker

MAX_HANDSHAKES = 64  # connections in their handshake at once (a thread each)
MAX_SILENT = 1024  # connections that have not spoken yet, at once
MAX_SILENT_PER_SOURCE = 256  # ... from one source address
SILENT_S = 10.0  # seconds a connection may stay silent before it is closed
ACCEPT_BATCH = 64  # connections accepted per wake-up of the accepting thread
SHORT_OF_DESCRIPTORS_S = 0.05  # the accepting thread's pause when the process has no fd left
_SHORT = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

log = logging.getLogger("tensorwire.transports")


def silent_bound() -> int:
    """:data:`MAX_SILENT`, or a quarter of this process's descriptor limit if that is less:
    silent strangers must never take the descriptors the hub's members need."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_SILENT
    return max(16, min(MAX_SILENT, soft // 4))


Admitted = TypeVar("Admitted")


def _host_port(conn: socket.socket, address: Any) -> str:
    return f"{address[0]}:{address[1]}"


def _source(address: Any) -> Any:
    """The part of an address one sender cannot vary at will (the host, not the port)."""
    return address[0] if isinstance(address, tuple) and address else address


class Listener(Generic[Admitted]):
    """Accepts connections on ``sock`` (bound and listening) in a thread of its own.

    Once a connection has sent something (see the module doc for the bounds on those that
    have not), it gets a thread that runs ``handshake(conn, address)``; what that returns is
    handed to ``serve`` on the same thread. A handshake that raises ``WireError`` or
    ``TransportError`` is reported to ``refused(who, error)`` and its connection closed, as
    is a connection dropped by a bound.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        name: str,
        handshake: Callable[[socket.socket, Any], Admitted],
        serve: Callable[[Admitted], None],
        refused: Callable[[str, Exception], None],
        who: Callable[[socket.socket, Any], str] = _host_port,
        silent_timeout: float | None = None,
    ) -> None:
        self.sock = sock
        self._name = name
        self._handshake = handshake
        self._serve = serve
        self._refused = refused
        self._who = who
        self._silent_timeout = SILENT_S if silent_timeout is None else silent_timeout
        self._lock = threading.Lock()  # guards the two below
        self._threads: set[threading.Thread] = set()  # one per connection, until it ends
        self._handshaking = 0
        # the accepting thread's own: silent connections and their addresses, those that spoke
        bound = silent_bound()
        self._silent: WaitingRoom[socket.socket] = WaitingRoom(
            bound, min(bound, MAX_SILENT_PER_SOURCE)
        )
        self._addresses: dict[socket.socket, Any] = {}
        self._spoke: deque[tuple[socket.socket, Any]] = deque()
        self._closed = False
        self._wake_r, self._wake_w = waker()  # a handshake ended, or close()
        sock.setblocking(False)
        self._sel = selectors.DefaultSelector()  # the accepting thread's own from here on
        self._sel.register(sock, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._accepting = threading.Thread(
            target=self._accept_loop, name=f"{name}-accept", daemon=True
        )
        self._accepting.start()

    @property
    def silent(self) -> int:
        """Connections accepted that have not spoken yet (a snapshot)."""
        return len(self._silent)

    def _accept_loop(self) -> None:
        sel = self._sel
        try:
            while not self._closed:
                timeout = None
                since = self._silent.oldest_since()
                if since is not None:
                    timeout = max(0.0, since + self._silent_timeout - time.monotonic())
                for key, _ in sel.select(timeout):
                    if key.fileobj is self.sock:
                        if not self._accept(sel):
                            return  # the listening socket failed
                    elif key.fileobj is self._wake_r:
                        drain(self._wake_r)
                    else:  # a silent connection spoke (or closed: its handshake sees that)
                        conn = key.fileobj
                        assert isinstance(conn, socket.socket)
                        if conn not in self._silent:
                            continue  # pushed out by a newer one in this same wake-up
                        sel.unregister(conn)
                        self._silent.remove(conn)
                        self._spoke.append((conn, self._addresses.pop(conn)))
                self._expire(sel)
                self._start_handshakes()
        finally:
            for conn in self._addresses:  # the silent ones
                conn.close()
            for conn, _ in self._spoke:
                conn.close()
            self._addresses.clear()
            self._spoke.clear()
            sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> bool:
        """Accept what is waiting (up to a batch); False once the socket is shut down."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return True  # none left, or one that gave up before it was accepted
            except OSError as exc:
                if exc.errno not in _SHORT:
                    return False  # the listening socket is shut down
                # out of descriptors: the connection waits in the backlog; a short pause,
                # not the end of the hub (silent ones are bounded below the limit, above)
                log.warning("%s: cannot accept now: %s", self._name, exc)
                time.sleep(SHORT_OF_DESCRIPTORS_S)
                return True
            conn.setblocking(True)
            for old, why in self._silent.add(conn, _source(address), time.monotonic()):
                self._drop(sel, old, f"said nothing while {why}")
            self._addresses[conn] = address
            sel.register(conn, selectors.EVENT_READ)
        return True

    def _drop(self, sel: selectors.BaseSelector, conn: socket.socket, reason: str) -> None:
        """Close a silent connection, telling ``refused`` why."""
        sel.unregister(conn)
        self._silent.remove(conn)
        self._refuse(conn, self._addresses.pop(conn), reason)

    def _refuse(self, conn: socket.socket, address: Any, reason: str) -> None:
        try:
            who = self._who(conn, address)
        except OSError:
            who = repr(address)
        self._refused(who, TransportError(reason))
        conn.close()

    def _expire(self, sel: selectors.BaseSelector) -> None:
        for conn in self._silent.older_than(time.monotonic() - self._silent_timeout):
            self._drop(sel, conn, f"said nothing for {self._silent_timeout:g} s")

    def _start_handshakes(self) -> None:
        while len(self._spoke) > MAX_SILENT:
            conn, address = self._spoke.popleft()
            self._refuse(conn, address, f"too many handshakes waiting ({MAX_SILENT})")
        while self._spoke:
            with self._lock:
                if self._handshaking >= MAX_HANDSHAKES:
                    return  # the next to end wakes this thread
                self._handshaking += 1
            conn, address = self._spoke.popleft()
            t = threading.Thread(
                target=self._connection,
                args=(conn, address),
                name=f"{self._name}-{address}",
                daemon=True,
            )
            with self._lock:
                self._threads.add(t)
            t.start()

    def _connection(self, conn: socket.socket, address: Any) -> None:
        try:
            try:
                admitted = self._handshake(conn, address)
            except (WireError, TransportError) as exc:
                self._refused(self._who(conn, address), exc)
                shutdown(conn)
                conn.close()
                return
            finally:
                with self._lock:
                    self._handshaking -= 1
                wake(self._wake_w)  # a turn for a connection that spoke
            self._serve(admitted)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def close(self) -> None:
        """Stop accepting and close the connections not in a handshake yet (the others'
        threads run on: see :meth:`join`)."""
        self._closed = True
        wake(self._wake_w)
        self._accepting.join(timeout=5)
        shutdown(self.sock)
        self.sock.close()
        self._wake_r.close()
        self._wake_w.close()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for each connection's thread to end."""
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=timeout)
