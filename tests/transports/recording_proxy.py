"""A TCP proxy for tests: forwards to a hub (or its broker) and keeps every byte it saw."""

from __future__ import annotations

import contextlib
import socket
import threading

MAX_KEPT = 256 << 20  # bytes kept per direction at most


class RecordingProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` (host, port) that keeps what it
    forwards each way (``up``: client to hub, ``down``: hub to client); ``flip_next(direction)``
    alters one byte of the next chunk of over 100 bytes going that way."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.seen = {"up": bytearray(), "down": bytearray()}
        self._flip: set[str] = set()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def all_seen(self) -> bytes:
        with self._lock:
            return bytes(self.seen["up"] + self.seen["down"])

    def flip_next(self, direction: str) -> None:
        self._flip.add(direction)

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self._server.accept()
            except OSError:
                return
            b = socket.create_connection(self.target, timeout=10)
            b.settimeout(None)
            ended: list[str] = []  # the directions that have ended (under self._lock)
            threading.Thread(target=self._pump, args=(a, b, "up", ended), daemon=True).start()
            threading.Thread(target=self._pump, args=(b, a, "down", ended), daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, direction: str, ended: list[str]
    ) -> None:
        """Forward ``src`` to ``dst`` until ``src`` ends, then pass its end on (half-close):
        the other direction still forwards what its side sent before it closed (a peer's
        last message must not be cut off because this side's write failed first)."""
        for _ in range(1_000_000):  # bounded: ends when either side closes
            try:
                data = src.recv(1 << 16)
            except OSError:
                break
            if not data:
                break
            with self._lock:
                if len(self.seen[direction]) < MAX_KEPT:
                    self.seen[direction] += data
            if direction in self._flip and len(data) > 100:
                self._flip.discard(direction)
                data = bytearray(data)
                data[len(data) // 2] ^= 1
            try:
                dst.sendall(data)
            except OSError:  # dst's peer is gone: the other direction reads its end
                break
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with self._lock:
            ended.append(direction)
            both = len(ended) == 2
        if both:  # the other direction ended first: close both sockets
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self._server.close()
