"""The transports' logger, and warnings a stranger could repeat, rate-limited."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("tensorwire.transports")

OPEN_DOOR = "tw_open_door"  # set (True) on the log record of a hub's "accepts ANYONE" warning

_LOG_EVERY_S = 10.0  # a repeated warning (one peer's junk, say) is logged at most this often
_last_logged: dict[str, tuple[float, int]] = {}


def _log_limited(key: str, text: str) -> None:
    """Log a warning, but one of the same ``key`` (a kind of fault from one peer) at most once
    per ``_LOG_EVERY_S`` seconds, saying how many were held back."""
    now = time.monotonic()
    last, held = _last_logged.get(key, (-_LOG_EVERY_S, 0))
    if now - last < _LOG_EVERY_S:
        _last_logged[key] = (last, held + 1)
        return
    if len(_last_logged) > 1024:
        _last_logged.clear()
    _last_logged[key] = (now, 0)
    log.warning("%s%s", text, f" (and {held} more like it)" if held else "")
