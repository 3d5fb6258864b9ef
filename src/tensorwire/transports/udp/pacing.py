"""A token bucket that paces datagrams to a rate, so a slow link is not flooded."""

from __future__ import annotations

import threading
import time

from tensorwire.errors import TransportTimeout

BURST_SECONDS = 0.002
"""Credit the bucket holds at most, in seconds of sending: absorbs ``sleep`` overshoot."""


class TokenBucket:
    """Allows ``rate`` bytes/s on average, in bursts of at most ``burst`` bytes.

    :meth:`take` debits a datagram and sleeps exactly as long as the debt needs to be repaid
    at the rate: the wait is computed, never fixed. Thread-safe: senders sharing a flow
    share its bucket.
    """

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive (bytes/s)")
        self.rate = rate
        self.capacity = max(float(burst), rate * BURST_SECONDS)
        self._tokens = self.capacity
        self._t = time.monotonic()
        self._lock = threading.Lock()

    def take(self, nbytes: int, deadline: float | None = None) -> None:
        """Debit ``nbytes``; return when sending them keeps to the rate (``TransportTimeout``
        if that is after ``deadline``, a ``time.monotonic()`` value)."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.capacity, self._tokens + (now - self._t) * self.rate)
            self._t = now
            self._tokens -= nbytes
            debt = -self._tokens
        if debt <= 0:
            return
        wait = debt / self.rate
        if deadline is not None and now + wait > deadline:
            raise TransportTimeout(
                f"pacing at {self.rate * 8:.3g} bit/s cannot send the message before its deadline"
            )
        time.sleep(wait)
