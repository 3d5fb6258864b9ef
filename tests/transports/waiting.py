"""Waiting for a state by polling it: here, for a thread to be inside a call (a ``recv``
blocked in its wait, say), which a bare sleep would only hope for."""

from __future__ import annotations

import sys
import threading
import time


def until_inside(thread: threading.Thread, name: str, timeout: float = 10.0) -> None:
    """Return once ``thread`` runs a function called ``name`` (anywhere on its stack);
    ``AssertionError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == name:
                return
            frame = frame.f_back
        time.sleep(0.005)
    raise AssertionError(f"{thread.name} was not inside {name}() within {timeout} s")
