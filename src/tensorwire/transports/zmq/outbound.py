"""The hub's sends through its ROUTER: one client's progress through a message, round robin
over the clients of a broadcast so a full queue holds up only its own client, and control
messages that never wait."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from tensorwire.errors import PeerGone, TransportError, TransportTimeout
from tensorwire.transports.base import remaining
from tensorwire.transports.sockets import wake
from tensorwire.transports.zmq.peer import peer_name
from tensorwire.transports.zmq.pieces import COPY_BYTES, START, SharedPieces, message_pieces
from tensorwire.transports.zmq.sockets import (
    QUEUE_PIECES,
    SEND_LAST,
    SEND_MORE,
    queue_piece,
    readable,
    wait_released,
)
from tensorwire.wire import EncodedMessage

log = logging.getLogger("tensorwire.transports.zmq")

FULL_WAIT_S = (0.0002, 0.002)  # first and longest wait between tries of a full queue, seconds


@dataclass(eq=False)
class Outbound:
    """One client's progress through a message the hub sends."""

    client_id: str
    ident: bytes | None = None  # its routing id, looked up as the first piece is queued
    next: int = 0  # index of the next piece to queue
    done: bool = False  # every piece is queued
    trackers: list[zmq.MessageTracker] = field(default_factory=list)
    released: int = 0  # trackers before this one are done


def wait_for_room(pending: list[Outbound], nap: float, left: float | None) -> None:
    """Wait until a full queue may have room: libzmq frees half a queue at a time, so until
    it wrote the zero-copy frame about half a queue after the oldest one still queued for one
    of ``pending``; or for ``nap`` seconds if all their queued frames were copies (no tracker
    says when those leave). Never past ``left`` seconds."""
    for out in pending:
        while out.released < len(out.trackers) and out.trackers[out.released].done:
            out.released += 1
        if out.released < len(out.trackers):
            target = min(out.released + QUEUE_PIECES // 2, len(out.trackers) - 1)
            longest = FULL_WAIT_S[1]
            with contextlib.suppress(zmq.NotDone):
                out.trackers[target].wait(longest if left is None else min(longest, left))
            return
    time.sleep(nap if left is None else min(nap, left))


class RouterOutbound:
    """The sending half of :class:`~tensorwire.transports.zmq.hub.ZmqHub`, from any thread."""

    _lock: threading.Lock  # whoever holds it may use the ROUTER (and _route)
    _router: zmq.Socket
    _route: dict[str, bytes]  # client id -> routing id of its current session
    _stopping: bool
    _polling: bool  # a reader may wait on the ROUTER's FD (guarded by _lock)
    _wake_w: socket.socket  # wakes the hub's reader

    def _check_readable(self) -> None:
        """After using the ROUTER (lock held): wake a reader that may wait on its FD if that
        use consumed the FD's edge (a send can process the ROUTER's pending commands)."""
        if self._polling and readable(self._router):
            wake(self._wake_w)

    def _say(
        self, ident: bytes, enc: EncodedMessage, what: str, first: Callable[[], None] | None = None
    ) -> bool:
        """Queue a control message if the peer's queue has room (never waits: the reader
        thread sends these); False if it could not. ``first`` runs just before it is queued,
        in the same hold of the lock (a welcome's: what it sets is set when the peer has the
        welcome, which libzmq may send at once, and no send falls between them)."""
        trackers: list[zmq.MessageTracker] = []
        with self._lock:
            try:
                if first is not None and not self._stopping:
                    first()
                queued = not self._stopping and all(
                    queue_piece(self._router, piece, trackers, ident)
                    for piece in message_pieces(enc)
                )
                why = "its queue is full"
            except zmq.ZMQError as exc:
                queued, why = False, str(exc)
            finally:
                self._check_readable()
        if not queued:  # debug: a stranger's junk is logged (rate-limited) by _rejected
            log.debug("zmq: could not send %s to %s: %s", what, peer_name(ident), why)
        return queued

    def _push(self, out: Outbound, pieces: SharedPieces) -> int:
        """Queue ``out``'s next pieces until they are all queued or its queue is full; return
        how many were queued. One hold of the ROUTER lock: the reader wakes once, not per piece.
        """
        queued = 0
        with self._lock:
            if self._stopping:
                raise PeerGone("the hub is closed")
            if out.ident is None:  # the client's session when the send began, for all pieces
                out.ident = self._route.get(out.client_id)
                if out.ident is None:
                    raise PeerGone(f"client {out.client_id!r} is not connected")
            try:
                while (piece := pieces.get(out.next)) is not None:
                    if not queue_piece(self._router, piece, out.trackers, out.ident):
                        return queued
                    out.next += 1
                    queued += 1
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    raise PeerGone(f"client {out.client_id!r} is not connected") from None
                raise TransportError(f"zmq: sending to {out.client_id!r}: {exc}") from None
            finally:
                self._check_readable()
        out.done = True
        return queued

    def _deliver(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Queue ``enc`` for every client, round robin so that a full queue (a slow client)
        holds up only its own send, then wait until libzmq released each one's zero-copy
        frames. Returns each client's seconds from the start, or the error its send ended with.
        """
        t = time.perf_counter()
        results: dict[str, float | Exception] = {}
        pending = [Outbound(c) for c in clients]
        queued: list[Outbound] = []
        pieces = SharedPieces(enc)
        nap = FULL_WAIT_S[0]
        while pending:
            progressed = False
            for out in pending:
                try:
                    progressed = self._push(out, pieces) > 0 or progressed
                except TransportError as exc:
                    results[out.client_id] = exc
            queued += [out for out in pending if out.done]
            pending = [out for out in pending if not out.done and out.client_id not in results]
            left = remaining(deadline)
            if not pending:
                break
            if left == 0.0:
                for out in pending:
                    results[out.client_id] = TransportTimeout(
                        f"client {out.client_id!r} took no more messages within the timeout "
                        f"(its queue of {QUEUE_PIECES} pieces stayed full: sent "
                        f"{out.next} of the message's pieces)"
                    )
                break
            nap = FULL_WAIT_S[0] if progressed else min(2 * nap, FULL_WAIT_S[1])
            wait_for_room(pending, nap, left)
        for out in queued:
            try:
                wait_released(out.trackers[out.released :], deadline, repr(out.client_id))
                results[out.client_id] = time.perf_counter() - t
            except TransportError as exc:
                results[out.client_id] = exc
        return results

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        if enc.nbytes < COPY_BYTES and self._queue_small(client_id, enc):
            return
        result = self._deliver([client_id], enc, deadline)[client_id]
        if isinstance(result, Exception):
            raise result

    def _queue_small(self, client_id: str, enc: EncodedMessage) -> bool:
        """Queue a message that goes as one copied frame, if the client's queue has room: no
        trackers to wait on, nothing to share. False to leave it to :meth:`_deliver`, which
        also says why a send fails."""
        frame = b"".join([START, *enc.frames()])  # next(message_pieces(enc)), without the generator
        with self._lock:
            ident = None if self._stopping else self._route.get(client_id)
            if ident is None:
                return False
            try:  # as queue_piece: libzmq checks the queue's room at the first frame only
                self._router.send(ident, SEND_MORE)
                self._router.send(frame, SEND_LAST)
                return True
            except zmq.ZMQError:  # a full queue or a gone client fail the first frame
                return False
            finally:
                if self._polling:
                    self._check_readable()

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Queue the message for every client from this thread; libzmq's I/O thread writes."""
        return self._deliver(clients, enc, deadline)
