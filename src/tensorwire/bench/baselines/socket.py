"""The raw socket baseline: what a careful hand-written sender does.

An 8-byte length, ``sendall`` of the array's memoryview; the receiver ``recv_into`` one
preallocated buffer it reuses, then acks with one byte.
"""

from __future__ import annotations

import socket
import struct
import time

import numpy as np

NAME = "raw-socket"
_LEN = struct.Struct("<Q")


class Sender:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(60)
        self.receiver_args = ["127.0.0.1", str(self._listener.getsockname()[1])]
        self._sock: socket.socket | None = None
        self._ack = bytearray(1)

    def once(self, arr: np.ndarray) -> float:
        if self._sock is None:
            self._sock, _ = self._listener.accept()
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        view = arr.reshape(-1).view(np.uint8).data
        t = time.perf_counter()
        self._sock.sendall(_LEN.pack(len(view)))
        self._sock.sendall(view)
        self._sock.recv_into(self._ack)
        return time.perf_counter() - t

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._listener.close()


def receive(args: list[str]) -> None:
    sock = socket.create_connection((args[0], int(args[1])))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header = bytearray(_LEN.size)
    buf = np.empty(0, np.uint8)
    while _recv_exact(sock, memoryview(header)):
        (n,) = _LEN.unpack(header)
        if buf.nbytes != n:
            buf = np.empty(n, np.uint8)
        if not _recv_exact(sock, buf.data):
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
