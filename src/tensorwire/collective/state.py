"""What every thread of one rank's group shares: the lock and conditions they wait on, the
links to the other ranks, the operation in progress, and the first failure seen."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from tensorwire.collective import messages
from tensorwire.errors import CollectiveError, CollectiveMismatch, RankFailed
from tensorwire.transports.sockets import wake, waker
from tensorwire.wire import EncodedMessage

if TYPE_CHECKING:
    from tensorwire.collective.connection import RankConnection

log = logging.getLogger("tensorwire.collective")

MAX_REFUSALS = 100  # refused strangers remembered (the rest are only logged)
ABORT_SEND_S = 2.0  # seconds an abort notice may take to reach a rank


def abort_notice(exc: CollectiveError) -> EncodedMessage:
    """The message that tells another rank the group failed with ``exc``."""
    rank = getattr(exc, "rank", -1)
    reason = getattr(exc, "reason", str(exc))
    return messages.abort(rank, reason, isinstance(exc, CollectiveMismatch))


class GroupState:
    """Shared by a rank's operation thread and its links' threads (see the module doc).

    A failure is sticky: the first one recorded is raised by every later operation.
    """

    def __init__(self, rank: int, size: int, silence: float) -> None:
        self.rank = rank
        self.size = size
        self.silence = silence
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # an operation waits on it
        self.connections: dict[int, RankConnection] = {}
        self.seq = 0  # the last operation this rank started
        self.bytes_sent = 0  # by this rank's operations, headers included
        self.failure: CollectiveError | None = None
        self.closing = False
        self.refusals: deque[tuple[str, str]] = deque(maxlen=MAX_REFUSALS)
        # an operation that reads its links itself waits in poll, not on ``changed``
        # (see :mod:`~tensorwire.collective.inline_reads`): woken through this pair
        self.polling = False
        self.inline_at = 0.0  # when an operation last read its links itself
        self.wake_r, self.wake_w = waker()
        self._spares: tuple[tuple[int, int, np.dtype], list[np.ndarray]] | None = None

    def add_connection(self, conn: RankConnection) -> None:
        with self.lock:
            self.connections[conn.peer] = conn
            self.changed.notify_all()

    def spares(self, count: int, n: int, dtype: np.dtype) -> list[np.ndarray]:
        """``count`` arrays of ``n`` elements of ``dtype`` for the operation in progress to
        receive into: the last ones asked for, when they were the same (fresh memory costs
        a page fault per page touched; the group keeps these few buffers)."""
        key = (count, n, np.dtype(dtype))
        if self._spares is None or self._spares[0] != key:
            self._spares = (key, [np.empty(n, dtype) for _ in range(count)])
        return self._spares[1]

    def notify(self) -> None:
        """Wake the operation's thread to look at the state again (call holding the lock)."""
        self.changed.notify_all()
        if self.polling:
            wake(self.wake_w)

    def close(self) -> None:
        """Free the operation's waker (the group is closed)."""
        self.wake_r.close()
        self.wake_w.close()

    def check(self) -> None:
        """Raise the group's failure, if it has one."""
        if self.failure is not None:
            raise self.failure

    def fail(self, exc: CollectiveError, tell: bool) -> CollectiveError:
        """Record ``exc`` if it is the first failure (and, with ``tell``, send every other
        rank an abort notice naming the culprit); return the failure the group now has."""
        with self.lock:
            if self.failure is not None or self.closing:
                return self.failure or exc
            self.failure = exc
            log.warning("rank %d: %s", self.rank, exc)
            if tell:
                notice = abort_notice(exc)
                for conn in self.connections.values():
                    conn.post(notice, time.monotonic() + ABORT_SEND_S, control=True)
            self.notify()
            for conn in self.connections.values():
                conn.notify()
            return exc

    def refused(self, who: str, error: Exception) -> None:
        """A connection to this rank's listener that did not prove it belongs to the group."""
        log.warning("rank %d refused a connection from %s: %s", self.rank, who, error)
        with self.lock:
            self.refusals.append((who, str(error)))
            self.changed.notify_all()

    def blame(self, waited_on: int, seq: int, what: str) -> RankFailed:
        """The rank to name when an operation runs out of time waiting on ``waited_on``: a
        rank silent for longer than ``silence`` (stopped, or cut off), else one that has not
        started the operation, else ``waited_on`` itself."""
        now = time.monotonic()
        with self.lock:
            quiet = {p: now - conn.last_heard for p, conn in self.connections.items()}
            behind = [p for p, conn in sorted(self.connections.items()) if conn.peer_seq < seq]
        silent = max(quiet, key=lambda p: quiet[p], default=None)
        if silent is not None and quiet[silent] > self.silence:
            return RankFailed(
                silent,
                f"sent rank {self.rank} nothing for {quiet[silent]:.1f} s "
                f"(stopped, or cut off) during operation #{seq}",
            )
        if behind:
            return RankFailed(behind[0], f"had not started operation #{seq} by its deadline")
        return RankFailed(waited_on, f"{what} (operation #{seq}) by the deadline")
