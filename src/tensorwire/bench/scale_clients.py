"""A process of ``tensorwire bench scale``'s clients: it holds channels to one hub, a thread
each, and plays the rounds the hub leads: receive the broadcast, send a reply, receive "done".

``python -m tensorwire.bench.scale_clients URL FIRST COUNT REPLY_BYTES TIMEOUT`` connects
clients ``scale-FIRST`` .. ``scale-(FIRST+COUNT-1)``: it prints ``ready`` once imported,
starts them when a line comes on its standard input (so that the hub times the joins, not
the interpreter's start), and prints one JSON line when the last has ended: how many
connected, replied and finished, and the first error of those that did not.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import numpy as np

import tensorwire


def _client(url: str, cid: str, reply: np.ndarray, timeout: float, tally: dict[str, Any]) -> None:
    lock = tally["lock"]
    try:
        with tensorwire.connect(url, client_id=cid, codec=None, timeout=timeout) as ch:
            with lock:
                tally["connected"] += 1
            ch.recv(timeout=timeout)  # the broadcast
            ch.send({"u": reply}, meta={"samples": 1}, timeout=timeout)
            with lock:
                tally["replied"] += 1
            ch.recv(timeout=timeout)  # done
            with lock:
                tally["finished"] += 1
    except Exception as exc:  # reported, counted: one client failing must not end the rest
        with lock:
            tally["failed"] += 1
            tally.setdefault("error", f"{cid}: {type(exc).__name__}: {exc}")


def main(argv: list[str]) -> int:
    url, first, count, reply_bytes, timeout = argv
    reply = np.ones(max(1, int(reply_bytes) // 4), np.float32)
    tally: dict[str, Any] = {
        "lock": threading.Lock(),
        "connected": 0,
        "replied": 0,
        "finished": 0,
        "failed": 0,
    }
    threading.stack_size(256 << 10)  # thousands of threads: small stacks
    threads = [
        threading.Thread(
            target=_client,
            args=(url, f"scale-{i}", reply, float(timeout), tally),
            daemon=True,
        )
        for i in range(int(first), int(first) + int(count))
    ]
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 1  # the hub went away before the start
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    del tally["lock"]
    print(json.dumps(tally), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
