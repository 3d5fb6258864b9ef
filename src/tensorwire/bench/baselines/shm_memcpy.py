"""The raw shared-memory baseline: ``multiprocessing.shared_memory`` as its users write it.

The sender copies the array into a named segment (a new, bigger one when the array outgrows
it) and sends its name and the byte count over a socket; the receiver copies the bytes out
into one buffer it reuses, then acks with one byte. Two copies, no serialisation.
"""

from __future__ import annotations

import socket
import struct
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from tensorwire.bench.baselines.socket import _recv_exact

NAME = "shm-memcpy"
_NOTE = struct.Struct("<Q32s")  # byte count, segment name


class Sender:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(60)
        self.receiver_args = ["127.0.0.1", str(self._listener.getsockname()[1])]
        self._sock: socket.socket | None = None
        self._shm: shared_memory.SharedMemory | None = None
        self._ack = bytearray(1)

    def once(self, arr: np.ndarray) -> float:
        if self._sock is None:
            self._sock, _ = self._listener.accept()
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        src = arr.reshape(-1).view(np.uint8)
        t = time.perf_counter()
        if self._shm is None or self._shm.size < src.nbytes:
            self._replace(src.nbytes)
        assert self._shm is not None and self._shm.buf is not None
        np.copyto(np.frombuffer(self._shm.buf, np.uint8, src.nbytes), src)
        self._sock.sendall(_NOTE.pack(src.nbytes, self._shm.name.encode()))
        self._sock.recv_into(self._ack)
        return time.perf_counter() - t

    def _replace(self, nbytes: int) -> None:
        # The receiver keeps its own mapping of the old segment: the name can go at once.
        self._unlink()
        self._shm = shared_memory.SharedMemory(create=True, size=nbytes)

    def _unlink(self) -> None:
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._listener.close()
        self._unlink()


def receive(args: list[str]) -> None:
    sock = socket.create_connection((args[0], int(args[1])))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    note = bytearray(_NOTE.size)
    shm: shared_memory.SharedMemory | None = None
    buf = np.empty(0, np.uint8)
    try:
        while _recv_exact(sock, memoryview(note)):
            n, raw_name = _NOTE.unpack(note)
            name = raw_name.rstrip(b"\0").decode()
            if shm is None or shm.name != name:
                if shm is not None:
                    shm.close()
                shm = shared_memory.SharedMemory(name=name)
                # Attaching registers the segment with this process's resource tracker, which
                # would unlink it at exit; it is the sender's (bpo-39959).
                resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
            if buf.nbytes != n:
                buf = np.empty(n, np.uint8)
            assert shm.buf is not None  # open until the finally below
            np.copyto(buf, np.frombuffer(shm.buf, np.uint8, n))
            sock.sendall(b"k")
    finally:
        if shm is not None:
            shm.close()
