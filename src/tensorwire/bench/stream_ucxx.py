"""``bench stream``'s raw ucxx contender: ``ucx://``'s baseline, the batches moved by ucxx
directly, as a careful hand-written ucxx program would (no session, no framing, no flow
control beyond UCX's own).

The sending side listens; the peer connects once and keeps its endpoint across trials (as
the other contenders keep theirs). Per trial the peer sends one byte (the request, as DoGet's
ticket), the sender ``stream_send``s ``batches`` batches, each the record batch's columns
back to back in one buffer, and the peer ``stream_recv``s each into one reused buffer,
timing each wait, as the other contenders' peers do.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from tensorwire.transports.ucx.settings import UcxSettings
from tensorwire.transports.ucx.workers import array, start_worker, stop_worker, ucx_api, wait

NAME = "raw-ucxx"
_IDLE_S = 120.0


class UcxxSource:
    """The sending side: a UCX listener; :meth:`serve` answers each request with a stream."""

    def __init__(self, columns: dict[str, np.ndarray], streams: int) -> None:
        self.batch = np.concatenate([c.view(np.uint8) for c in columns.values()])
        self.batches = 0
        self._streams = streams
        self._worker = start_worker(UcxSettings())
        self._endpoints: list[Any] = []
        self._listener = ucx_api().UCXListener.create(
            worker=self._worker, port=0, cb_func=self._accept
        )
        self.port = self._listener.port
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _accept(self, conn_request: Any) -> None:
        ep = self._listener.create_endpoint_from_conn_request(conn_request, True)
        self._endpoints.append(ep)
        t = threading.Thread(target=self._serve, args=(ep,), daemon=True)
        self._threads.append(t)
        t.start()

    def _serve(self, ep: Any) -> None:
        ask = np.zeros(1, np.uint8)
        while not self._stop.is_set():
            try:
                wait(ep.stream_recv(array(ask)), None, "request")
            except OSError:
                return
            requests = [ep.stream_send(array(self.batch)) for _ in range(self.batches)]
            for request in requests:
                wait(request, time.monotonic() + _IDLE_S, "send")

    def close(self) -> None:
        self._stop.set()
        for ep in self._endpoints:
            if ep.alive:
                ep.close()
        stop_worker(self._worker)


_peer: dict[int, tuple[Any, list[Any]]] = {}


def receive(port: int, streams: int, batches: int, batch_bytes: int) -> dict[str, Any]:
    """The peer's side of one trial: ``streams`` streams of ``batches`` batches at once."""
    if port not in _peer:
        worker = start_worker(UcxSettings())
        api = ucx_api()
        _peer[port] = (
            worker,
            [api.UCXEndpoint.create(worker, "127.0.0.1", port, True) for _ in range(streams)],
        )
    waits: list[float] = []
    lock = threading.Lock()

    def one(ep: Any) -> None:
        buf = np.empty(batch_bytes, np.uint8)
        mine = []
        wait(ep.stream_send(array(np.ones(1, np.uint8))), time.monotonic() + _IDLE_S, "ask")
        for _ in range(batches):
            t = time.perf_counter()
            wait(ep.stream_recv(array(buf)), time.monotonic() + _IDLE_S, "receive")
            mine.append(time.perf_counter() - t)
        with lock:
            waits.extend(mine)

    started, cpu = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=one, args=(ep,)) for ep in _peer[port][1]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "seconds": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu,
        "bytes": len(waits) * batch_bytes,
        "waits": waits,
    }


def close_peer() -> None:
    for worker, endpoints in _peer.values():
        for ep in endpoints:
            if ep.alive:
                ep.close()
        stop_worker(worker)
