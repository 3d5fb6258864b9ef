"""Datagrams from addresses no joined peer said were its own: counted, and reported at most
once per :data:`STRANGER_REPORT_S` (a flood of them never floods the log)."""

from __future__ import annotations

import time

from tensorwire.errors import ChunkError

STRANGER_REPORT_S = 1.0  # datagrams from strangers are reported at most this often (seconds)


class StrangerReport:
    """How many strangers' datagrams came since the last report, and when that was."""

    def __init__(self) -> None:
        self.count = 0  # their datagrams since the last report
        self.reported = -STRANGER_REPORT_S  # time.monotonic() of the last report

    def note(self, sender: tuple[str, int], nbytes: int) -> ChunkError | None:
        """Count one; the error to report, if one is due."""
        self.count += 1
        now = time.monotonic()
        if now - self.reported < STRANGER_REPORT_S:
            return None
        error = ChunkError(
            f"dropped {self.count} datagram(s) from addresses that have not joined, "
            f"the last ({nbytes} bytes) from {sender[0]}:{sender[1]}: a client joins over "
            "its control connection first"
        )
        self.count, self.reported = 0, now
        return error
