"""The raw ucxx baseline: what a careful hand-written ucxx sender does, as ucxx's own
benchmark (``ucxx.benchmarks.backends.ucxx_core``, thread progress mode) does it.

A UCX listener on loopback; an 8-byte length then the array's memory by ``stream_send``
(zero-copy); the receiver ``stream_recv`` one preallocated buffer it reuses, then acks with
one byte. Both on the same UCX settings as ``ucx://`` (``UCX_TLS=tcp,sm,self`` on ``lo``).
"""

from __future__ import annotations

import struct
import time
from typing import Any

import numpy as np

from tensorwire.transports.ucx.settings import UcxSettings
from tensorwire.transports.ucx.workers import array, start_worker, stop_worker, ucx_api, wait

NAME = "raw-ucxx"
_LEN = struct.Struct("<Q")
_IDLE_S = 600.0  # the receiver gives up after this long without a message


class Sender:
    def __init__(self) -> None:
        self._worker = start_worker(UcxSettings())
        self._endpoints: list[Any] = []
        self._listener = ucx_api().UCXListener.create(
            worker=self._worker, port=0, cb_func=self._accept
        )
        self.receiver_args = ["127.0.0.1", str(self._listener.port)]
        self._ack = np.zeros(1, np.uint8)
        self._head = np.zeros(_LEN.size, np.uint8)

    def _accept(self, conn_request: Any) -> None:
        self._endpoints.append(self._listener.create_endpoint_from_conn_request(conn_request, True))

    def once(self, arr: np.ndarray) -> float:
        while not self._endpoints:
            time.sleep(0.001)
        ep = self._endpoints[0]
        view = arr.reshape(-1).view(np.uint8)
        t = time.perf_counter()
        self._head[:] = np.frombuffer(_LEN.pack(view.nbytes), np.uint8)
        ack = ep.stream_recv(array(self._ack))
        for request in (ep.stream_send(array(self._head)), ep.stream_send(array(view))):
            wait(request, None, "send")
        wait(ack, None, "ack")
        return time.perf_counter() - t

    def close(self) -> None:
        if self._endpoints:
            self._head[:] = 0  # length 0: done
            wait(self._endpoints[0].stream_send(array(self._head)), time.monotonic() + 10, "send")
            self._endpoints[0].close()
        del self._listener
        stop_worker(self._worker)


def receive(args: list[str]) -> None:
    worker = start_worker(UcxSettings())
    ep = ucx_api().UCXEndpoint.create(worker, args[0], int(args[1]), True)
    head = np.zeros(_LEN.size, np.uint8)
    ack = np.ones(1, np.uint8)
    buf = np.empty(0, np.uint8)
    try:
        while True:
            wait(ep.stream_recv(array(head)), time.monotonic() + _IDLE_S, "receive")
            (n,) = _LEN.unpack(head.tobytes())
            if not n:
                return
            if buf.nbytes != n:
                buf = np.empty(n, np.uint8)
            wait(ep.stream_recv(array(buf)), time.monotonic() + _IDLE_S, "receive")
            wait(ep.stream_send(array(ack)), time.monotonic() + _IDLE_S, "send")
    finally:
        ep.close()
        stop_worker(worker)
