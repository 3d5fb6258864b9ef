"""A tensorwire client in its own process, for tests that stop or kill a peer.

    python peer_process.py URL CLIENT_ID

Connects, prints "ready", then answers every message from the hub with one carrying the same
``meta`` and a tensor ``n`` holding the number of tensors it got; a message with
``meta["stop"]`` ends it. Bounded: it exits after 10,000 messages or 600 s.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import tensorwire


def main(url: str, client_id: str) -> int:
    deadline = time.monotonic() + 600
    with tensorwire.connect(url, client_id=client_id, timeout=60) as ch:
        print("ready", flush=True)
        for _ in range(10_000):
            if time.monotonic() > deadline:
                return 1
            msg = ch.recv(timeout=max(deadline - time.monotonic(), 0.1))
            if msg.meta.get("stop"):
                return 0
            ch.send({"n": np.array(msg.n_tensors)}, meta=msg.meta, timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
