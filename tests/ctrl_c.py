"""Child processes that take Ctrl-C as a terminal's foreground job would."""

from __future__ import annotations

import signal


def heed_sigint() -> None:
    """A ``preexec_fn``: SIGINT back to its default in the child. A shell's background job
    (a CI script started with ``&``, say) ignores SIGINT, children inherit that across exec,
    and Python then leaves it ignored: the run under test would go on to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
