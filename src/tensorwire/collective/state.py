"""What every thread of one rank's group shares: the lock and conditions they wait on, the
links to the other ranks, the operation in progress, and the first failure seen."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from tensorwire.collective import messages
from tensorwire.errors import CollectiveError, CollectiveMismatch, RankFailed
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

    def add_connection(self, conn: RankConnection) -> None:
        with self.lock:
            self.connections[conn.peer] = conn
            self.changed.notify_all()

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
            self.changed.notify_all()
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
