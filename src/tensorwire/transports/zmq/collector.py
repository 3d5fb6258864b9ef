"""pyzmq's zero-copy collector, started once per process before any zmq endpoint sends.

pyzmq starts the thread that tells a tracked zero-copy send it is done (its "garbage
collector") lazily, at the first such send, without a lock around the context and socket it
makes for it. When many threads make their first tracked sends at once, one may make that
socket in a second context nobody reads: no tracker of the process fires again, and every
later send waits out its deadline (seen as a whole ``bench scale`` client process hung in
``wait_released``); or one socket is closed under another, and libzmq aborts the process
(``signaler.cpp``: ``pfd.revents & POLLIN``). Starting it here, under a lock, before the
process's first zero-copy send (``sockets.queue_piece``) avoids the race. (Started instead
when each channel connected, the clients of ``bench scale`` at 2,000 spent 2-4x the CPU in
one day's runs; not understood, so it starts where pyzmq would start it.)
"""

from __future__ import annotations

import os
import threading

import zmq

_lock = threading.Lock()
_started_pid = 0  # the process whose collector was started: a forked child starts its own


def start_zero_copy_collector() -> None:
    """Start pyzmq's zero-copy collector in this process if it is not yet; called before
    every zero-copy send (a check of the process id once started)."""
    global _started_pid
    if _started_pid == os.getpid():  # started: no lock for every send
        return
    with _lock:
        if _started_pid != os.getpid():
            # A tracked zero-copy frame starts the collector and makes its socket, in this
            # thread; dropped at once, it is the collector's first message.
            zmq.Frame(bytearray(1), copy=False, track=True)
            _started_pid = os.getpid()
