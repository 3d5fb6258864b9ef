"""Operations on small tensors read their links on their own thread.

A piece that a link's reader thread takes in and hands over costs two thread wake-ups (the
reader's, then the operation's) and a hand-over of the interpreter lock: on a busy machine
more than reading and decoding the piece itself. So an operation on a small tensor asks
every link's reader to step aside (:meth:`RankConnection.hand_over`) and waits in ``poll``
on all the links at once, reading whatever comes (its own pieces, a heartbeat, an abort
notice, a bye) as the readers would. A reader takes its link back once no operation has
read it for a heartbeat's time (between bursts of small operations: no wake-ups while they
run), or at once when an operation on a large tensor begins to wait.

Only the operation's thread polls; other threads (a sender, a failure) wake it through the
state's waker (:meth:`GroupState.notify`).
"""

from __future__ import annotations

import select
import time

from tensorwire.collective.connection import RankConnection
from tensorwire.collective.state import GroupState
from tensorwire.transports.sockets import drain

INLINE_READ_BYTES = 256 << 10
"""Operations on tensors up to this size read their links themselves."""


def wait(state: GroupState, deadline: float) -> None:
    """One wait of the operation's thread (holding the state's lock once, as the
    operation's waits do): until something arrives on a link, another thread changes the
    state, or ``deadline``; what arrived is read."""
    conns = [c for c in state.connections.values() if not c.reader_done]
    ready = [c.hand_over() for c in conns]  # every link's reader asked, then checked
    left = deadline - time.monotonic()
    if not all(ready) or left <= 0:
        state.changed.wait(max(left, 0.0))  # a reader stepping aside notifies
        return
    state.polling = True
    state.lock.release()
    try:
        poller = select.poll()
        poller.register(state.wake_r, select.POLLIN)
        by_fd: dict[int, RankConnection] = {}
        for conn in conns:
            # a sealed link's socket: read_ready took every whole message its stream held
            raw = getattr(conn.sock, "sock", conn.sock)
            by_fd[raw.fileno()] = conn
            poller.register(raw, select.POLLIN)
        for fd, _ in poller.poll(left * 1000):
            ready_conn = by_fd.get(fd)
            if ready_conn is None:
                drain(state.wake_r)
            else:
                ready_conn.read_ready()
    finally:
        state.lock.acquire()
        state.polling = False
        state.inline_at = time.monotonic()


def give_back(state: GroupState) -> None:
    """Let every link's reader read again (holding the state's lock)."""
    for conn in state.connections.values():
        conn.give_back()
