"""The Arrow memory pool of the processes the ``tensorwire`` command starts.

gRPC serves each Flight call on a thread of its own (a flight:// hub: two per session), and
the default pool of pyarrow's wheels, mimalloc, keeps pages per thread: a hub held 264-279 KB
per idle client at 2,000 clients against 126-131 KB with Arrow's system pool (glibc malloc),
and spent less CPU over a broadcast and gather (``docs/transports/flight.md``, section 12).
Arrow reads its choice once, from ``ARROW_DEFAULT_MEMORY_POOL``, when it first allocates, so
the command sets it before anything imports pyarrow, for itself and the processes it starts
(hubs, devices); a value already set is kept. A program that serves flight:// itself sets the
variable the same way.
"""

from __future__ import annotations

import os

ENV = "ARROW_DEFAULT_MEMORY_POOL"


def prefer_system_pool() -> str:
    """Ask Arrow for its system pool unless the environment chose one; return the choice."""
    return os.environ.setdefault(ENV, "system")
