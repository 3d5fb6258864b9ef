"""One rank of a test elastic group, in its own process (or the group's coordinator).

    python elastic_rank.py train URL RANK SIZE STOPFILE [CERTS]
    python elastic_rank.py coordinator - 0 1 SIZE

``train``: joins the elastic group at URL and allreduces a large "gradient" (every element
``member + 1``, so the sum tells which ranks it was over) step after step, printing one
JSON line per step: the ranks the step completed over, whether the sum is theirs and whether
every link is sealed (TLS); the last element carries "stop" (STOPFILE exists on some rank),
so that all stop at one step. With CERTS (a directory ``tensorwire certs`` wrote) the rank
joins with those credentials.
``coordinator``: serves an elastic rendezvous on loopback and prints its URL. Bounded: every
operation has a deadline and the process gives up after 300 s.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

from tensorwire.collective import Group, Rendezvous
from tensorwire.errors import CollectiveError
from tensorwire.transports.sockets import TlsStream

FAULT_TIMEOUT = 10.0  # seconds: each operation's deadline (4 s was missed by a rank starting its
# first step beside a CPU hog; a hung rank is still dropped after it, a dead one at once)
GRADIENT = 8 << 20  # bytes: a ring allreduce of this is mid-flight most of the time


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def train(url: str, rank: int, size: int, stop: str, certs: str | None = None) -> None:
    group = Group.join(
        url,
        rank=rank,
        size=size,
        serve=False,
        elastic=True,
        heartbeat=0.25,
        timeout=FAULT_TIMEOUT,
        connect_timeout=60,
        credentials=certs,
    )
    say(ready=rank, members=list(group.members))
    try:
        for step in range(100_000):
            x = np.full(GRADIENT // 4, float(rank + 1), np.float32)
            x[-1] = 1.0 if os.path.exists(stop) else 0.0
            group.allreduce(x)
            over = list(group.last_members)
            ok = bool((x[:-1] == sum(m + 1 for m in over)).all())
            sealed = all(isinstance(c.sock, TlsStream) for c in group._state.connections.values())
            say(step=step, over=over, ok=ok, sealed=sealed, t=time.monotonic())
            if x[-1] > 0:
                break
    except CollectiveError as exc:
        culprit = getattr(exc, "rank", None)
        say(error=type(exc).__name__, rank=culprit, message=str(exc), t=time.monotonic())
        return
    finally:
        group.close()
    say(done=rank)


def coordinator(size: int) -> None:
    with Rendezvous("tcp://127.0.0.1:0", size, timeout=120, elastic=True) as rendezvous:
        say(url=rendezvous.url)
        sys.stdin.readline()  # until the test ends it


def main(argv: list[str]) -> int:
    signal.alarm(300)
    scenario, url, rank, size = argv[1], argv[2], int(argv[3]), int(argv[4])
    if scenario == "coordinator":
        coordinator(int(argv[5]))
    else:
        train(url, rank, size, argv[5], argv[6] if len(argv) > 6 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
