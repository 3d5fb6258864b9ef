"""The pyarrow Flight baseline: ``do_put`` of a record batch, acked through the put's metadata.

The sender wraps the array's memory as a one-row binary column (``pa.py_buffer``, no copy)
and writes it as a record batch on one long-lived ``do_put`` stream; the receiver's
``FlightServerBase.do_put`` copies the column's buffer into a numpy buffer it reuses and
acks with one byte of ``app_metadata`` on the put's metadata writer, which the sender reads.

The receiver serves on a free port; it tells the sender which one over a TCP connection the
sender listens for (the setup only: no array goes through it).
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

NAME = "pyarrow-flight"
_SCHEMA = pa.schema([("array", pa.binary())])
_PORT = struct.Struct("<H")


def _batch(view: memoryview) -> pa.RecordBatch:
    """``view``'s bytes as the one value of a binary column, without copying them."""
    offsets = pa.py_buffer(np.array([0, len(view)], np.int32))
    column = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(view)])
    return pa.RecordBatch.from_arrays([column], schema=_SCHEMA)


class Sender:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(60)
        self.receiver_args = ["127.0.0.1", str(self._listener.getsockname()[1])]
        self._client: flight.FlightClient | None = None

    def _connect(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            (port,) = _PORT.unpack(conn.recv(_PORT.size, socket.MSG_WAITALL))
        self._client = flight.FlightClient(("127.0.0.1", port))
        self._client.wait_for_available(timeout=60)
        descriptor = flight.FlightDescriptor.for_path("array")
        self._writer, self._acks = self._client.do_put(descriptor, _SCHEMA)

    def once(self, arr: np.ndarray) -> float:
        if self._client is None:
            self._connect()
        batch = _batch(arr.reshape(-1).view(np.uint8).data)
        t = time.perf_counter()
        self._writer.write_batch(batch)
        self._acks.read()
        return time.perf_counter() - t

    def close(self) -> None:
        if self._client is not None:
            self._writer.close()
            self._client.close()
        self._listener.close()


class _Receiver(flight.FlightServerBase):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0))
        self.buf = np.empty(0, np.uint8)

    def do_put(self, context, descriptor, reader, writer) -> None:
        for chunk in reader:
            column = chunk.data.column(0)
            offsets = np.frombuffer(column.buffers()[1], np.int32)
            data = memoryview(column.buffers()[2])[offsets[0] : offsets[1]]
            if self.buf.nbytes != len(data):
                self.buf = np.empty(len(data), np.uint8)
            self.buf[:] = data
            writer.write(b"k")
        # The sender closed its stream: it is gone, and so is the reason to serve.
        threading.Thread(target=self.shutdown, daemon=True).start()


def receive(args: list[str]) -> None:
    server = _Receiver()
    with socket.create_connection((args[0], int(args[1]))) as sock:
        sock.sendall(_PORT.pack(server.port))
    server.wait()
