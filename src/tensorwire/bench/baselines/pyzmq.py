"""The pyzmq baseline: a PAIR socket used as pyzmq's documentation shows for numpy arrays.

The sender ``send(arr, copy=False)`` (zero-copy: libzmq writes straight from the array's
memory); the receiver ``recv(copy=False)`` and copies the frame, through ``np.frombuffer``,
into one preallocated buffer it reuses, then acks with one byte. An empty message says the
sender is done.
"""

from __future__ import annotations

import time

import numpy as np
import zmq

NAME = "pyzmq"
_IDLE_MS = 600_000  # the receiver gives up after this long without a message (milliseconds)


class Sender:
    def __init__(self) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PAIR)
        self._sock.linger = 1000
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.receiver_args = ["127.0.0.1", str(port)]

    def once(self, arr: np.ndarray) -> float:
        view = arr.reshape(-1).view(np.uint8).data
        t = time.perf_counter()
        self._sock.send(view, copy=False)
        self._sock.recv()
        return time.perf_counter() - t

    def close(self) -> None:
        self._sock.send(b"")
        self._sock.close()
        self._ctx.term()


def receive(args: list[str]) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.linger = 0
    sock.connect(f"tcp://{args[0]}:{int(args[1])}")
    buf = np.empty(0, np.uint8)
    try:
        while sock.poll(_IDLE_MS):
            frame = sock.recv(copy=False)
            data = np.frombuffer(frame.buffer, np.uint8)
            if not data.nbytes:
                return
            if buf.nbytes != data.nbytes:
                buf = np.empty(data.nbytes, np.uint8)
            np.copyto(buf, data)
            del frame, data  # hand libzmq its buffer back before the next message
            sock.send(b"k")
    finally:
        sock.close()
        ctx.term()
