"""One rank of a secured test group, in its own process.

    python secure_rank.py SCENARIO URL RANK SIZE CREDENTIALS

CREDENTIALS is a directory ``tensorwire certs`` wrote, or ``-`` for none. Prints one JSON
object per line: {"ready": ...} with this rank's listener, what the scenario reports, then
{"done": ...}, or {"error": ...} when joining or an operation fails. Bounded: every
operation has a deadline and the process gives up after 300 s.

Scenarios:

- ``pattern``: the other ranks dial this rank through a recording proxy it runs in front of
  its listener (it announces the proxy's address at the rendezvous); max-allreduce a
  recognisable byte pattern, large (ring) and small (recursive doubling), on every rank, and
  report whether the result is right and whether the pattern crossed the proxy in clear.
- ``join``: only join, giving up after ``JOIN_TIMEOUT`` s (a rank the test expects refused).
- ``stranger``: wait for the test (a line on stdin) while it sends strangers to the ranks'
  ports, wait until rank 0 has refused them, allreduce, and report the refusals.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transports"))
from recording_proxy import RecordingProxy

from tensorwire.collective import Group, GroupOptions
from tensorwire.collective.credentials import rank_credentials
from tensorwire.collective.rendezvous import Address, address_toward, announce
from tensorwire.errors import TensorwireError

PATTERN = b"TENSORWIRE-CLEARTEXT-PATTERN-42!"
LARGE = 1 << 20  # bytes: along the ring
SMALL = 4 << 10  # bytes: recursive doubling
TIMEOUT = 60.0
JOIN_TIMEOUT = 10.0


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def pattern_of(nbytes: int) -> np.ndarray:
    return np.frombuffer(PATTERN * (nbytes // len(PATTERN)), np.uint8).copy()


def join_through_proxy(url: str, rank: int, size: int, credentials: str | None) -> tuple:
    """The group, with the others dialling this rank through a recording proxy."""
    proxies: list[RecordingProxy] = []

    def exchange(address: Address):  # announce the proxy's address in place of the listener's
        proxy = RecordingProxy(tuple(address))
        proxies.append(proxy)
        creds = rank_credentials(credentials, rank)
        return announce(url, rank, size, ("127.0.0.1", proxy.port), TIMEOUT, creds)

    options = GroupOptions(credentials=credentials, timeout=TIMEOUT)
    group = Group._connect(rank, size, address_toward(url), options, exchange)
    return group, proxies[0]


def pattern(url: str, rank: int, size: int, credentials: str | None) -> None:
    group, proxy = join_through_proxy(url, rank, size, credentials)
    say(ready=rank, address=list(group.address))
    try:
        right = True
        for nbytes in (LARGE, SMALL):
            x = pattern_of(nbytes)
            group.allreduce(x, "max", timeout=TIMEOUT)
            right = right and bool(np.array_equal(x, pattern_of(nbytes)))
        group.barrier(timeout=TIMEOUT)
        seen = proxy.all_seen
        say(right=right, seen=len(seen), clear=PATTERN in seen)
    finally:
        group.close()
        proxy.close()


def stranger(url: str, rank: int, size: int, credentials: str | None) -> None:
    group = Group.join(url, rank=rank, size=size, serve=False, credentials=credentials)
    say(ready=rank, address=list(group.address))
    try:
        want = int(sys.stdin.readline())  # refusals the test expects rank 0 to record
        deadline = time.monotonic() + TIMEOUT
        while rank == 0 and len(group.refusals) < want and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the group's state, not waiting for time to pass
        x = np.full(5000, rank, np.int64)
        group.allreduce(x, timeout=TIMEOUT)
        say(total=int(x[0]), refusals=group.refusals)
    finally:
        group.close()


def join(url: str, rank: int, size: int, credentials: str | None) -> None:
    options = GroupOptions(credentials=credentials, connect_timeout=JOIN_TIMEOUT)
    with Group.join(url, rank=rank, size=size, serve=False, options=options) as group:
        say(ready=rank, address=list(group.address))


SCENARIOS = {"pattern": pattern, "stranger": stranger, "join": join}


def main(scenario: str, url: str, rank: int, size: int, credentials: str) -> int:
    signal.alarm(300)
    try:
        SCENARIOS[scenario](url, rank, size, None if credentials == "-" else credentials)
    except TensorwireError as exc:
        say(error=type(exc).__name__, message=str(exc))
        return 0
    say(done=rank)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
