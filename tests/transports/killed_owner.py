"""A process that starts something and is then SIGKILLed, for tests of what must end with it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def killed_owner(code: str, timeout: float) -> Iterator[list[str]]:
    """Run ``code`` in a new interpreter and yield the words of the first line it prints;
    SIGKILL it when the block ends (and reap it within ``timeout`` seconds)."""
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    try:
        yield owner.stdout.readline().split()
    finally:
        owner.kill()
        owner.wait(timeout=timeout)


def wait_until(done: Callable[[], bool], deadline: float, step: float = 0.05) -> None:
    """Poll ``done`` until it is true or ``time.monotonic()`` passes ``deadline``."""
    while not done() and time.monotonic() < deadline:
        time.sleep(step)
