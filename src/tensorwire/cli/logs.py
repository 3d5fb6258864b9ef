"""Where the command's log lines go (standard error), and what a benchmark's own loopback hubs
leave out of them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from tensorwire.cli.console import err_console
from tensorwire.transports.base import OPEN_DOOR

_debug = False  # set by --debug (or TENSORWIRE_DEBUG=1): errors show their traceback


def set_debug(debug: bool, quiet: bool = False) -> None:
    """The command's --debug and --quiet: DEBUG lines and tracebacks, or warnings only."""
    global _debug
    _debug = debug
    show_logs(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)


def debugging() -> bool:
    """Whether --debug was given: errors show their traceback."""
    return _debug


def show_logs(level: int) -> None:
    """Send tensorwire's log lines at ``level`` and above to standard error, once."""
    from rich.logging import RichHandler

    logger = logging.getLogger("tensorwire")
    logger.setLevel(level)
    if not any(getattr(h, "_tensorwire_cli", False) for h in logger.handlers):
        handler = RichHandler(
            console=err_console, show_path=False, markup=False, rich_tracebacks=False
        )
        handler._tensorwire_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.propagate = False  # a root handler (logging.basicConfig) would print them twice


class LoopbackHubChatter(logging.Filter):
    """Drops the transports' lines below WARNING (joins and leaves, chiefly) and their
    open-door warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("tensorwire.transports"):
            return True
        return record.levelno >= logging.WARNING and not getattr(record, OPEN_DOOR, False)


@contextlib.contextmanager
def benchmark_hubs(say: bool = True) -> Iterator[None]:
    """While a benchmark serves its own peers from hubs on 127.0.0.1: one line says so (if
    ``say``: once per command), and each hub's "accepts ANYONE" warning and the transports'
    INFO lines (joins, leaves) are not printed (--debug prints them). Warnings and errors of
    any other kind still are."""
    if _debug:
        yield
        return
    if say:
        err_console.print(
            "[dim]bench: its hubs listen on 127.0.0.1 for its own peers only, with no "
            "credentials; their INFO lines (joins, leaves) are not shown (--debug shows them)[/]"
        )
    chatter = LoopbackHubChatter()
    handlers = [
        h for h in logging.getLogger("tensorwire").handlers if getattr(h, "_tensorwire_cli", False)
    ]
    for h in handlers:
        h.addFilter(chatter)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(chatter)
