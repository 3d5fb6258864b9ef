"""Pairing a session's two calls on a flight:// hub: a downlink (the hello) waits for its
uplink, or an uplink that came first waits for its downlink.

Every call is a coroutine on the hub's event loop, which alone calls :class:`Pairing`. Each
waiting call waits on an event of its own, woken only by its other half (or by being pushed
out, or the hub closing), so a thousand devices joining at once cost a wake-up each, not one
per waiting call. Waiting calls are bounded like a socket hub's silent connections
(:class:`~tensorwire.transports.sockets.WaitingRoom`): at most ``total`` of each kind, at
most ``per_source`` from one host; past either, the oldest waiting call (of that host) is
ended to make room. A device's two calls pair within milliseconds, so whoever opens calls
that never pair pushes out their own, and a device is never refused for want of room.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from tensorwire.errors import SessionRefused
from tensorwire.transports.flight.peer import Peer
from tensorwire.transports.sockets import WaitingRoom

OTHER_CERTIFICATE = "its session was opened under another certificate"


@dataclass(eq=False)
class Waiter:
    """One call waiting for its other half: ``ready`` is set once ``peer`` is paired (for a
    downlink, its own peer; for an uplink, its downlink's) or ``dropped`` says why not."""

    source: str
    tls_name: str | None
    peer: Peer | None = None
    dropped: str | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self, timeout: float) -> bool:
        """Wait until paired (True), or dropped or ``timeout`` seconds passed (False). A
        cancelled call (its client hung up) raises ``CancelledError`` here."""
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError:
            return False
        return self.dropped is None


class Pairing:
    """Downlinks waiting for their uplink and uplinks waiting for their downlink, by
    session id; thread-safe."""

    def __init__(self, total: int, per_source: int) -> None:
        self._lock = threading.Lock()
        self._downlinks: WaitingRoom[str] = WaitingRoom(total, per_source)
        self._uplinks: WaitingRoom[str] = WaitingRoom(total, per_source)
        self._waiters: dict[tuple[bool, str], Waiter] = {}  # (is an uplink, session id)
        self._closed = False

    def __len__(self) -> int:
        """Calls waiting now."""
        with self._lock:
            return len(self._waiters)

    def downlink(self, peer: Peer, source: str, now: float) -> Waiter | None:
        """A downlink with ``peer``'s hello: paired at once with an uplink that came first
        (``peer.attached``), else waiting; None once the hub is closing. Raises
        ``SessionRefused`` when another opening downlink has the same session id."""
        sid = peer.hello.session
        me = Waiter(source, peer.tls_name, peer)
        with self._lock:
            if self._closed:
                return None
            if (False, sid) in self._waiters:
                raise SessionRefused(f"session id {sid!r} is already opening")
            up = self._waiters.get((True, sid))
            if up is not None:
                self._take(True, sid)
                if up.tls_name == peer.tls_name:
                    peer.attached = True
                    up.peer = peer
                    me.ready.set()
                else:
                    up.dropped = OTHER_CERTIFICATE
                up.ready.set()
                if me.ready.is_set():
                    return me
            self._add(False, sid, me, now)
        return me

    def uplink(self, sid: str, source: str, tls_name: str | None, now: float) -> Waiter | None:
        """An uplink for session ``sid``: paired at once with its waiting downlink, else
        waiting; None once the hub is closing, or when another uplink waits for ``sid``
        already. Under TLS only the certificate that opened a session may open its uplink:
        ``SessionRefused`` if the downlink's certificate name is not ``tls_name`` (one that
        came first is dropped when its downlink comes)."""
        me = Waiter(source, tls_name)
        with self._lock:
            if self._closed or (True, sid) in self._waiters:
                return None
            down = self._waiters.get((False, sid))
            if down is not None and down.tls_name != tls_name:
                raise SessionRefused(OTHER_CERTIFICATE)
            if down is not None:
                self._take(False, sid)
                assert down.peer is not None
                down.peer.attached = True
                me.peer = down.peer
                me.ready.set()
                down.ready.set()
                return me
            self._add(True, sid, me, now)
        return me

    def withdraw(self, uplink: bool, sid: str, me: Waiter) -> bool:
        """Stop waiting (timed out, or cancelled); False if ``me`` was paired meanwhile."""
        with self._lock:
            if me.ready.is_set() and me.dropped is None:
                return False
            if self._waiters.get((uplink, sid)) is me:
                self._take(uplink, sid)
            return True

    def close(self) -> None:
        """Wake every waiting call, unpaired: the hub is closing (call it on the loop)."""
        with self._lock:
            self._closed = True
            waiters, self._waiters = list(self._waiters.values()), {}
        for w in waiters:
            w.dropped = "the hub is closing"
            w.ready.set()

    def _add(self, uplink: bool, sid: str, me: Waiter, now: float) -> None:
        room = self._uplinks if uplink else self._downlinks
        for old, why in room.add(sid, me.source, now):
            pushed = self._waiters.pop((uplink, old))
            pushed.dropped = f"its other call did not come while {why}"
            pushed.ready.set()
        self._waiters[(uplink, sid)] = me

    def _take(self, uplink: bool, sid: str) -> None:
        (self._uplinks if uplink else self._downlinks).remove(sid)
        del self._waiters[(uplink, sid)]
