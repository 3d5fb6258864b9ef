"""One collective operation in flight on a rank: its sequence number, its signature (what it
is, on which shape and dtype: every rank must call the same) and its deadline; the sends and
receives the algorithms make, each checked against all three."""

from __future__ import annotations

import time
from typing import NoReturn

import numpy as np

from tensorwire.collective import inline_reads, messages
from tensorwire.collective.connection import RankConnection
from tensorwire.collective.state import GroupState
from tensorwire.errors import CollectiveMismatch, RankFailed


class Operation:
    """An operation named by ``sig`` with ``timeout`` seconds to complete on this rank."""

    def __init__(self, state: GroupState, sig: str, timeout: float, checksum: bool | str) -> None:
        state.check()
        with state.lock:
            state.seq += 1
            self.seq = state.seq
        self.sig = sig
        self.deadline = time.monotonic() + timeout
        self._state = state
        self._checksum = checksum
        self._tickets: dict[int, int] = {}
        self._inline = False  # this thread reads the links (see inline_reads)

    def read_inline(self, nbytes: int) -> None:
        """This operation moves pieces of ``nbytes``: when small, its thread reads its
        links itself (:mod:`~tensorwire.collective.inline_reads`)."""
        self._inline = nbytes <= inline_reads.INLINE_READ_BYTES

    def spares(self, count: int, n: int, dtype: np.dtype) -> list[np.ndarray]:
        """``count`` arrays of ``n`` elements of ``dtype`` to receive into, kept by the
        group from one operation to the next (see :meth:`GroupState.spares`)."""
        return self._state.spares(count, n, dtype)

    def _connection(self, peer: int) -> RankConnection:
        return self._state.connections[peer]

    def send(self, peer: int, piece: np.ndarray) -> None:
        """Queue ``piece`` for ``peer``; it must stay unchanged until :meth:`wait_sent`."""
        conn = self._connection(peer)
        digest = self._checksum is True or (self._checksum == "auto" and not conn.checked)
        enc = messages.data(piece, self.seq, self.sig, digest)
        self._state.bytes_sent += enc.nbytes
        self._tickets[peer] = conn.send(enc, self.deadline)

    def expect(self, peer: int, buf: np.ndarray) -> None:
        """The next piece from ``peer`` not yet expected belongs in ``buf``."""
        self._connection(peer).expect(buf)

    def recv(
        self, peer: int, into: np.ndarray | None = None, size: int | None = None
    ) -> np.ndarray:
        """The next piece from ``peer`` (of ``size`` elements, or ``into``'s), in ``into``
        when given; raises the group's failure, or names the culprit at the deadline."""
        state = self._state
        conn = self._connection(peer)
        with state.lock:
            while not conn.inbox:
                self._wait(peer, conn, f"did not send rank {state.rank} its part")
            msg = conn.take()
        meta = msg.meta
        if meta.get("seq") != self.seq or meta.get("sig") != self.sig:
            self._mismatch(peer, f"operation #{meta.get('seq')}: {meta.get('sig')}")
        piece = msg.tensors.get("x")
        want = into.size if into is not None else size
        if not isinstance(piece, np.ndarray) or (want is not None and piece.size != want):
            got = getattr(piece, "size", None)
            self._mismatch(peer, f"a piece of {got} elements where {want} were due")
        if into is None:
            return piece
        if piece is not into:
            if piece.dtype != into.dtype:
                self._mismatch(peer, f"a piece of {piece.dtype} where {into.dtype} was due")
            into[...] = piece.reshape(into.shape)
        return into

    def wait_sent(self) -> None:
        """Block until everything this operation sent is out (its buffers free again)."""
        state = self._state
        with state.lock:
            for peer, ticket in self._tickets.items():
                conn = self._connection(peer)
                # a rank that took part and then closed the group got all it needed from us
                while conn.sent < ticket and not (conn.said_bye and conn.peer_seq >= self.seq):
                    self._wait(peer, conn, f"took none of what rank {state.rank} sent")
        self._tickets.clear()

    def _wait(self, peer: int, conn: RankConnection, what: str) -> None:
        """One wait on the state's condition, or the error that ends the operation."""
        state = self._state
        state.check()
        if conn.gone is not None:
            raise state.fail(RankFailed(peer, conn.gone), tell=True)
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise state.fail(state.blame(peer, self.seq, what), tell=True)
        if self._inline:
            inline_reads.wait(state, self.deadline)
            return
        inline_reads.give_back(state)
        state.changed.wait(left)

    def _mismatch(self, peer: int, theirs: str) -> NoReturn:
        reason = (
            f"it called {theirs}; rank {self._state.rank} called operation #{self.seq}: {self.sig}"
        )
        raise self._state.fail(CollectiveMismatch(peer, reason), tell=True)
