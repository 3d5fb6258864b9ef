"""Deadlines, and dialling a peer until it answers or the deadline passes."""

from __future__ import annotations

import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, overload

from tensorwire.errors import SessionRefused, TransportTimeout, UnknownHost
from tensorwire.transports.base.logs import log


def dial(
    connect: Callable[[float | None], Any],
    *,
    what: str,
    timeout: float | None,
    first_delay: float = 0.02,
    max_delay: float = 1.0,
) -> Any:
    """Call ``connect(deadline)`` until it returns, backing off after each failure.

    A refusal (:class:`SessionRefused`: wrong version, credential ...) and a host name no name
    server knows (:class:`UnknownHost`) are final and raised at once; any other ``OSError`` is
    retried, after a pause that doubles up to ``max_delay`` (each a random half to whole of
    it), until ``timeout`` seconds have passed, saying so in the log ("cannot reach WHAT
    (why), retrying (n; giving up in S s)"), then
    :class:`TransportTimeout` names the last error.
    """
    deadline = deadline_after(timeout)
    delay = first_delay
    attempt = 0
    while True:
        attempt += 1
        try:
            return connect(deadline)
        except SessionRefused:
            raise
        except OSError as exc:
            if isinstance(exc, socket.gaierror) and exc.errno == socket.EAI_NONAME:
                raise UnknownHost(
                    f"cannot reach {what}: its host name is not known ({exc.strerror}); "
                    "check the URL"
                ) from None
            left = remaining(deadline)
            if left is not None and left <= delay:
                raise TransportTimeout(
                    f"could not reach {what} within {timeout} s ({attempt} attempts): {exc}"
                ) from None
            if attempt == 1 or attempt % 10 == 0:
                until = "" if left is None else f"; giving up in {left:.0f} s"
                log.info("cannot reach %s (%s), retrying (%d%s)", what, exc, attempt, until)
        # jittered: peers that failed together (a hub or broker that went away, a channel
        # many shared) do not all come back at the same instant, and again each round
        time.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, max_delay)


@overload
def deadline_after(timeout: float) -> float: ...
@overload
def deadline_after(timeout: None) -> None: ...
@overload
def deadline_after(timeout: float | None) -> float | None: ...
def deadline_after(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def default_client_id() -> str:
    """``host-pid-random``: unique enough for a client that was given no id."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def soon(deadline: float | None, step: float = 0.05) -> float:
    """``deadline``, or ``step`` seconds from now if that comes first (to look around)."""
    at = time.monotonic() + step
    return at if deadline is None else min(deadline, at)
