"""The segments one endpoint sends through, who holds each, and sending a message through
them (or inline, in its packet, when it is small)."""

from __future__ import annotations

import contextlib
import threading
import time

from tensorwire.errors import PeerGone, TransportError, TransportTimeout
from tensorwire.transports.base import deadline_after, remaining
from tensorwire.transports.shm.connection import Connection, control_packet, send_each
from tensorwire.transports.shm.options import ALIGN, BYE_TIMEOUT, INLINE_BYTES
from tensorwire.transports.shm.segments import BadSegment, Segment
from tensorwire.wire import EncodedMessage
from tensorwire.wire.pool import size_class


class Outbox:
    """The segments one endpoint sends through, shared by all its receivers.

    A segment is free once every receiver it was sent to released it. Free segments are
    kept for reuse (their pages stay mapped on both sides: no page faults) up to
    ``cache_bytes``; beyond that the least recently used are retired.
    """

    def __init__(self, max_segments: int, cache_bytes: int) -> None:
        if max_segments < 1:
            raise ValueError(f"max_segments must be at least 1, got {max_segments}")
        self.max_segments = max_segments
        self.cache_bytes = cache_bytes
        self._cond = threading.Condition()
        self._segments: dict[int, Segment] = {}
        self._next_id = 1
        self._closed = False

    def _held_by(self, conn: Connection) -> int:
        return sum(conn in s.holders for s in self._segments.values())

    def acquire(
        self, nbytes: int, conns: list[Connection], deadline: float | None
    ) -> tuple[Segment | None, list[Connection], list[Connection], dict[Connection, Exception]]:
        """A segment of at least ``nbytes`` and the conns it is now held for; the conns to
        try again (they hold ``max_segments`` of these segments); why the others were left out.

        Waits (until ``deadline``) only while every live conn holds ``max_segments``: a
        receiver that keeps its messages does not hold up the others.
        """
        with self._cond:
            while True:
                if self._closed:
                    return None, [], [], {c: PeerGone("shm: endpoint closed") for c in conns}
                failed: dict[Connection, Exception] = {
                    c: PeerGone(f"shm: {c.peer!r} is gone") for c in conns if not c.alive
                }
                full = [c for c in conns if c.alive and self._held_by(c) >= self.max_segments]
                takers = [c for c in conns if c not in failed and c not in full]
                left = remaining(deadline)
                if takers or not full or left == 0.0:
                    break
                self._cond.wait(left)
            if left == 0.0:
                for c in full:
                    failed[c] = TransportTimeout(
                        f"shm: {c.peer!r} still holds max_segments={self.max_segments} big "
                        "messages (their arrays are views of shared memory): it must drop them, "
                        "copy what it keeps, or receive with recv(out=...) before it gets more; "
                        "or raise max_segments"
                    )
                full = []
            if not takers:
                return None, [], full, failed
            free = [s for s in self._segments.values() if not s.holders and s.size >= nbytes]
            seg = min(free, key=lambda s: s.size) if free else None
            if seg is None:
                try:
                    seg = Segment(self._next_id, size_class(nbytes))
                except OSError as exc:
                    raise TransportError(
                        f"shm: cannot make a {nbytes}-byte shared segment: {exc}"
                    ) from None
                self._next_id += 1
                self._segments[seg.id] = seg
            seg.holders = set(takers)
            retired = self._trim()
        self._retire(retired)
        return seg, takers, full, failed

    def notify(
        self,
        seg: Segment,
        conns: list[Connection],
        offset: int,
        nbytes: int,
        deadline: float | None,
    ) -> dict[Connection, Exception]:
        """Tell each of ``conns`` the message is in ``seg`` (passing the descriptor to those
        that never had it); return why each that was not told failed, and release it."""
        note = control_packet("shm", {"seg": seg.id, "offset": offset, "nbytes": nbytes})
        with self._cond:
            fresh = {c for c in conns if c not in seg.mapped_by}
        failed = send_each(conns, lambda c: ([note], [seg.fd] if c in fresh else None), deadline)
        with self._cond:
            seg.mapped_by.update(c for c in fresh if c.alive and c not in failed)
        for conn in failed:
            with contextlib.suppress(BadSegment):  # forgotten meanwhile: nothing to release
                self.release(conn, seg.id)
        return failed

    def release(self, conn: Connection, seg_id: int) -> None:
        """``conn`` is done with ``seg_id``; BadSegment if it did not hold it."""
        with self._cond:
            seg = self._segments.get(seg_id)
            if seg is None or conn not in seg.holders:
                raise BadSegment(f"{conn.peer!r} released segment {seg_id}, which it does not hold")
            seg.holders.discard(conn)
            seg.last_used = time.monotonic()
            retired = self._trim()
            self._cond.notify_all()
        self._retire(retired)

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone: whatever it held is free."""
        with self._cond:
            for seg in self._segments.values():
                seg.holders.discard(conn)
                seg.mapped_by.discard(conn)
            retired = self._trim()
            self._cond.notify_all()
        self._retire(retired)

    def _trim(self) -> list[Segment]:
        """Take out free segments beyond ``cache_bytes``, least recently used first."""
        free = sorted(
            (s for s in self._segments.values() if not s.holders), key=lambda s: s.last_used
        )
        cached = sum(s.size for s in free)
        out = []
        for seg in free:
            if cached <= self.cache_bytes:
                break
            cached -= seg.size
            del self._segments[seg.id]
            out.append(seg)
        return out

    def _retire(self, segments: list[Segment]) -> None:
        for seg in segments:
            note = control_packet("drop", {"seg": seg.id})
            for conn in seg.mapped_by:
                if conn.alive:
                    with contextlib.suppress(TransportError):
                        conn.send([note], deadline_after(BYE_TIMEOUT))
            seg.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            segments = list(self._segments.values())
            self._segments.clear()
            self._cond.notify_all()
        for seg in segments:
            seg.close()


def send_message(
    outbox: Outbox, conns: list[Connection], enc: EncodedMessage, deadline: float | None
) -> dict[Connection, Exception]:
    """Send ``enc`` to each of ``conns``; return the error of each that failed."""
    if enc.nbytes <= INLINE_BYTES:
        frames = enc.frames()
        return send_each(conns, lambda _: (frames, None), deadline)
    failed: dict[Connection, Exception] = {}
    waiting = conns
    while waiting:  # each round takes at least one conn, or fails them all
        seg, takers, waiting, left_out = outbox.acquire(enc.nbytes + ALIGN, waiting, deadline)
        failed.update(left_out)
        if seg is None:
            continue
        try:
            offset = seg.write(enc)  # once per round: a late receiver gets a copy of its own
        except BaseException:
            for conn in takers:
                with contextlib.suppress(BadSegment):  # forgotten meanwhile: nothing to release
                    outbox.release(conn, seg.id)
            raise
        failed.update(outbox.notify(seg, takers, offset, enc.nbytes, deadline))
    return failed
