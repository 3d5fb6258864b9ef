"""What a process's zmq endpoints share: one ZeroMQ context for all its channels (one libzmq
I/O thread and reaper per process, not two native threads per channel: 2,000 channels in 20
processes were 4,000 threads on two cores), and pyzmq's zero-copy collector, started once.

pyzmq starts the thread that tells a tracked zero-copy send it is done (its "garbage
collector") lazily, at the first such send, without a lock around its context and socket:
when many threads make their first tracked sends at once, one of them may make the socket in
a second context nobody reads, and then no tracker of the process ever fires (every later
send waits out its deadline; seen as a whole ``bench scale`` client process hung in
``wait_released``). Starting it here, under a lock, before any send, avoids the race.
"""

from __future__ import annotations

import itertools
import os
import threading

import zmq

_lock = threading.Lock()
_context: zmq.Context[zmq.Socket[bytes]] | None = None
_context_pid = 0  # the process that made _context: a forked child makes its own
_collector_pid = 0  # the process whose zero-copy collector was started
_monitors = itertools.count()


def channel_context() -> zmq.Context[zmq.Socket[bytes]]:
    """This process's context for channels, made on first use. Never terminated: a channel
    closes its own sockets, and waits for its goodbye itself."""
    global _context, _context_pid
    with _lock:
        _start_collector()
        if _context is None or _context_pid != os.getpid():
            # A context inherited through fork is unusable (its threads did not come along):
            # left alone, never closed, as libzmq asks of a child.
            _context = zmq.Context()
            # Sockets, not connections: three per channel (its DEALER, the monitor's two ends).
            _context.set(zmq.MAX_SOCKETS, int(_context.get(zmq.SOCKET_LIMIT)))
            _context_pid = os.getpid()
        return _context


def start_zero_copy_collector() -> None:
    """Start pyzmq's zero-copy collector in this process if it is not yet (see the module
    doc); call before the first tracked send."""
    with _lock:
        _start_collector()


def _start_collector() -> None:
    global _collector_pid
    if _collector_pid != os.getpid():
        # A tracked zero-copy frame starts the collector and makes its socket, in this thread;
        # dropped at once, it is the collector's first message.
        zmq.Frame(bytearray(1), copy=False, track=True)
        _collector_pid = os.getpid()


def monitor_address() -> str:
    """An inproc endpoint for one socket monitor, unique in this process: pyzmq's default is
    named after the socket's descriptor, which a later socket reuses, and the endpoints of one
    context must never meet (libzmq reaps a closed socket, and its monitor's endpoint, later)."""
    return f"inproc://tensorwire-zmq-monitor-{os.getpid()}-{next(_monitors)}"
