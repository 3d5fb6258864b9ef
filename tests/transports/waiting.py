"""Waiting for a state by polling it: here, for a thread to be inside a call (a ``recv``
blocked in its wait, say), which a bare sleep would only hope for."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable


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


def until(cond: Callable[[], bool], timeout: float = 20.0) -> bool:
    """Poll ``cond`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
