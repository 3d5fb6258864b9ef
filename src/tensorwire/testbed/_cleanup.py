"""Close open testbeds when the interpreter exits or a terminating signal arrives.

Ctrl-C needs nothing here: KeyboardInterrupt unwinds the ``with`` block. SIGTERM and SIGHUP
would end the process without unwinding, so while a testbed is open they get a handler (if
nobody else installed one) that closes every open testbed and then dies of the same signal.
A SIGKILL cannot be caught: the next testbed started removes what that run left.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from typing import Any, Protocol


class Closable(Protocol):
    def close(self) -> None: ...


_OPEN: dict[int, Closable] = {}
_LOCK = threading.Lock()
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_installed: dict[int, Any] = {}


def register(testbed: Closable) -> None:
    """Close ``testbed`` at exit or on SIGTERM/SIGHUP unless it is closed (unregistered) first."""
    with _LOCK:
        _OPEN[id(testbed)] = testbed
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                if sig not in _installed and signal.getsignal(sig) == signal.SIG_DFL:
                    _installed[sig] = signal.signal(sig, _on_signal)


def unregister(testbed: Closable) -> None:
    """Forget ``testbed`` (it has been closed); restore the signal handlers when none is open."""
    with _LOCK:
        _OPEN.pop(id(testbed), None)
        if not _OPEN and threading.current_thread() is threading.main_thread():
            for sig, previous in _installed.items():
                signal.signal(sig, previous)
            _installed.clear()


def close_all() -> None:
    """Close every open testbed (errors are ignored: this runs while the process ends)."""
    with _LOCK:
        testbeds = list(_OPEN.values())
    for testbed in testbeds:
        with contextlib.suppress(Exception):
            testbed.close()


def _on_signal(signum: int, frame: object) -> None:
    close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _forget_in_child() -> None:
    # A forked child (pyroute2 forks to enter namespaces) must not close its parent's testbeds
    # when it exits and runs the atexit handlers it inherited.
    _OPEN.clear()
    _installed.clear()


atexit.register(close_all)
os.register_at_fork(after_in_child=_forget_in_child)
