"""The receiving side of ``tensorwire bench transfer``, run as its own process.

``python -m tensorwire.bench.peer [--cpu N] tw URL CLIENT_ID reuse|fresh`` receives tensorwire
messages (into the previous message's arrays with ``reuse``) and acks each one with its
resident memory before the message and its peak after, bytes;
``python -m tensorwire.bench.peer [--cpu N] baseline MODULE ARGS...`` runs the receiver of the
baseline ``tensorwire.bench.baselines.MODULE``.
"""

from __future__ import annotations

import os
import sys


def _peak_rss_bytes() -> int:
    """This process's own peak resident memory (VmHWM), bytes. Not ``ru_maxrss``: a child
    started by ``subprocess`` inherits its parent's, which can be far larger."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_tensorwire(url: str, client_id: str, reuse: bool) -> None:
    import tensorwire
    from tensorwire.errors import PeerGone

    with tensorwire.connect(url, client_id=client_id, codec=None, timeout=120) as ch:
        out = None
        while True:
            before = None if reuse else _rss_bytes()  # memory is measured on fresh receives
            try:
                msg = ch.recv(out=out)
            except PeerGone:
                return
            if reuse:
                out = msg.tensors
                ch.send(None, {"ack": True})
            else:
                ch.send(None, {"ack": True, "rss_before": before, "rss_peak": _peak_rss_bytes()})
            del msg


def main(argv: list[str]) -> None:
    if argv[0] == "--cpu":
        os.sched_setaffinity(0, {int(argv[1])})
        argv = argv[2:]
    if argv[0] == "tw":
        run_tensorwire(argv[1], argv[2], reuse=argv[3] == "reuse")
    elif argv[0] == "baseline":
        from tensorwire.bench import baselines

        baselines.load(argv[1]).receive(argv[2:])
    else:
        raise SystemExit(f"unknown peer kind {argv[0]!r}: use tw or baseline")


if __name__ == "__main__":
    main(sys.argv[1:])
