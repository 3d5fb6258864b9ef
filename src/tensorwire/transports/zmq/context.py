"""The ZeroMQ context a process's channels share: one libzmq I/O thread and one reaper for
all of them, instead of two native threads per channel (docs/transports/zmq.md, section 12).

It is tensorwire's own, not pyzmq's ``Context.instance()``, so that a program ending that
one (``term()``) does not end its channels; it is made at first use, and again in a forked
child (a context does not survive a fork). Each channel holds three of its sockets (the
DEALER and the two ends of its monitor), so it has room for as many as libzmq allows rather
than its default 1,023 (341 channels).
"""

from __future__ import annotations

import os
import threading

import zmq

_lock = threading.Lock()
_context: zmq.Context | None = None
_pid = 0  # the process that made _context


def process_context() -> zmq.Context:
    """This process's context for channels, made on first use."""
    global _context, _pid
    if _pid == os.getpid() and _context is not None:
        return _context
    with _lock:
        if _pid != os.getpid() or _context is None:
            context = zmq.Context()
            context.max_sockets = context.get(zmq.SOCKET_LIMIT)
            _context, _pid = context, os.getpid()
        return _context
