"""The client processes of :mod:`tensorwire.bench.mqtt_floor`: minimal MQTT 3.1.1 clients on
raw sockets, one selector per process, no paho and no tensorwire.

``python -m tensorwire.bench.mqtt_floor_clients PORT FIRST COUNT QOS REPLY_BYTES TIMEOUT``:
connects COUNT clients to the broker on 127.0.0.1:PORT, subscribes each to
:data:`DOWN`, prints ``ready``; answers the first big message each gets (the broadcast) with
REPLY_BYTES on :data:`UP`, prints ``done`` once all have, and leaves when stdin closes (so that
the broker still holds every connection while the driver counts).
"""

from __future__ import annotations

import select
import selectors
import socket
import struct
import sys
import time
from collections.abc import Iterator

from tensorwire.transports.brokers.mqtt_packets import (
    connect_packet,
    publish_header,
    subscribe_packet,
)

DOWN, UP = b"tw-floor/down", b"tw-floor/up"
READ_BYTES = 1 << 20


def dial(port: int, client_id: str, topic: bytes | None, qos: int, timeout: float) -> socket.socket:
    """A connected client (CONNACK read), subscribed to ``topic`` (SUBACK read) if given."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(connect_packet(client_id, keepalive_s=600))
    _read_exactly(sock, 4)
    if topic is not None:
        sock.sendall(subscribe_packet(topic, qos))
        _read_exactly(sock, 5)
    return sock


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        more = sock.recv(n - len(got))
        if not more:
            raise ConnectionError("the broker closed the connection")
        got += more
    return got


class PacketReader:
    """Whole packets from a non-blocking socket: (first byte, the first 64 bytes after the
    length, the length); payloads are dropped once counted."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self._buf = sock, bytearray()

    def packets(self) -> Iterator[tuple[int, bytes, int]]:
        try:
            data = self.sock.recv(READ_BYTES)
        except BlockingIOError:
            return
        if not data:
            raise ConnectionError("the broker closed the connection")
        self._buf += data
        while len(self._buf) >= 2:
            n, shift, i = 0, 0, 1
            while i < len(self._buf):
                n |= (self._buf[i] & 127) << shift
                shift, i = shift + 7, i + 1
                if not self._buf[i - 1] & 128:
                    break
            else:
                return
            if len(self._buf) < i + n:
                return
            yield self._buf[0], bytes(self._buf[i : i + 64]), n
            del self._buf[: i + n]

    def ack(self, first: int, head: bytes) -> None:
        """PUBACK a QoS 1 PUBLISH (its packet id follows the topic)."""
        if (first >> 1) & 3:
            topic_len = struct.unpack("!H", head[:2])[0]
            send_all(self.sock, b"\x40\x02" + head[2 + topic_len : 4 + topic_len])


def send_all(sock: socket.socket, data: bytes) -> None:
    """Send all of ``data`` on a non-blocking socket (waits for room)."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            select.select([], [sock], [], 1.0)


def main(argv: list[str]) -> int:
    port, first, count, qos, reply_bytes = (int(a) for a in argv[:5])
    deadline = time.monotonic() + float(argv[5])
    socks = [dial(port, f"tw-floor-{first + k}", DOWN, qos, 30) for k in range(count)]
    selector = selectors.DefaultSelector()
    readers = {}
    for sock in socks:
        sock.setblocking(False)
        readers[sock] = PacketReader(sock)
        selector.register(sock, selectors.EVENT_READ)
    print("ready", flush=True)
    reply = publish_header(UP, reply_bytes, qos) + bytes(reply_bytes)
    waiting = set(socks)
    while waiting and time.monotonic() < deadline:
        for key, _ in selector.select(1.0):
            reader = readers[key.fileobj]  # type: ignore[index]
            for first_byte, head, _length in reader.packets():
                if first_byte >> 4 == 3 and reader.sock in waiting:  # the broadcast
                    reader.ack(first_byte, head)
                    send_all(reader.sock, reply)
                    waiting.discard(reader.sock)
    print("done" if not waiting else f"missed {len(waiting)}", flush=True)
    sys.stdin.read()  # until the driver closes it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
