"""The receiving side of ``tensorwire bench transfer``, run as its own process.

``python -m tensorwire.bench.peer [--cpu N] tw URL CLIENT_ID reuse|fresh`` receives tensorwire
messages (into the previous message's arrays with ``reuse``) and acks each one with its resident
memory before the message and its peak after, bytes;
``python -m tensorwire.bench.peer [--cpu N] raw HOST PORT`` does the same with a plain socket: an
8-byte length, then ``recv_into`` one preallocated (and reused) buffer, then a 1-byte ack.
"""

from __future__ import annotations

import os
import resource
import socket
import struct
import sys

import numpy as np

_LEN = struct.Struct("<Q")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_tensorwire(url: str, client_id: str, reuse: bool) -> None:
    import tensorwire
    from tensorwire.errors import PeerGone

    with tensorwire.connect(url, client_id=client_id, codec=None) as ch:
        out = None
        while True:
            before = _rss_bytes()
            try:
                msg = ch.recv(out=out if reuse else None)
            except PeerGone:
                return
            if reuse:
                out = msg.tensors
            ch.send(None, {"ack": True, "rss_before": before, "rss_peak": _peak_rss_bytes()})
            del msg


def run_raw(host: str, port: int) -> None:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header = bytearray(_LEN.size)
    buf = np.empty(0, np.uint8)
    while True:
        if not _recv_exact(sock, memoryview(header)):
            return
        (n,) = _LEN.unpack(header)
        if buf.nbytes != n:
            buf = np.empty(n, np.uint8)
        if not _recv_exact(sock, memoryview(buf)):
            return
        sock.sendall(b"k")


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            return False
        got += n
    return True


def main(argv: list[str]) -> None:
    if argv[0] == "--cpu":
        os.sched_setaffinity(0, {int(argv[1])})
        argv = argv[2:]
    if argv[0] == "tw":
        run_tensorwire(argv[1], argv[2], reuse=argv[3] == "reuse")
    else:
        run_raw(argv[1], int(argv[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
