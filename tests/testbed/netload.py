"""Plain-socket load programs run inside testbed nodes, and helpers to run them.

As a script (``python netload.py MODE ...``) it prints one JSON line:

- ``tcp-recv PORT``: accept one connection, read to EOF; ``bytes`` and ``seconds`` from the
  first byte to the last;
- ``tcp-send HOST PORT SECONDS [BYTES]``: connect and send for SECONDS (or BYTES, if given);
- ``udp-recv PORT COUNT IDLE``: count datagrams numbered below COUNT until IDLE s pass quietly;
- ``udp-send HOST PORT COUNT INTERVAL``: send COUNT numbered datagrams INTERVAL s apart, then
  end markers.

Everything is bounded: each mode ends within its time (or its socket timeout of 20 s).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from typing import Any

SCRIPT = __file__
TIMEOUT = 20.0  # seconds any socket operation may take before the program gives up


def tcp_recv(port: int) -> dict[str, Any]:
    with socket.create_server(("0.0.0.0", port)) as server:
        server.settimeout(TIMEOUT)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(TIMEOUT)
            buf = bytearray(1 << 16)
            total, first, last = 0, None, None
            while n := conn.recv_into(buf):
                last = time.monotonic()
                first = first or last
                total += n
    return {"bytes": total, "seconds": (last or 0) - (first or 0)}


def tcp_send(host: str, port: int, seconds: float, nbytes: int | None) -> dict[str, Any]:
    chunk = b"\x5a" * (1 << 16)
    sent = 0
    with socket.create_connection((host, port), timeout=TIMEOUT) as conn:
        end = time.monotonic() + seconds
        while (nbytes is None and time.monotonic() < end) or (nbytes is not None and sent < nbytes):
            piece = chunk if nbytes is None else chunk[: nbytes - sent]
            conn.sendall(piece)
            sent += len(piece)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # wait for the receiver to close: everything has arrived
    return {"bytes": sent}


def udp_recv(port: int, count: int, idle: float) -> dict[str, Any]:
    seen = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # ride out a stall
        sock.bind(("0.0.0.0", port))
        sock.settimeout(TIMEOUT)
        while True:
            try:
                data = sock.recv(64)
            except TimeoutError:
                break
            seq = int.from_bytes(data[:4], "big")
            if seq < count:
                seen.add(seq)
            sock.settimeout(idle)  # after the first datagram, stop once the sender is quiet
    return {"received": len(seen)}


def udp_send(host: str, port: int, count: int, interval: float) -> dict[str, Any]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for seq in [*range(count), *[count] * 20]:
            sock.sendto(seq.to_bytes(4, "big") + bytes(60), (host, port))
            time.sleep(interval)
    return {"sent": count}


def run(proc: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, Any]:
    """The JSON line a netload process prints; AssertionError with stderr if it failed."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"netload failed ({proc.returncode}): {err}"
    return json.loads(out)  # type: ignore[no-any-return]


def start(testbed: Any, node: str, *args: object) -> subprocess.Popen[str]:
    """Start ``netload.py args...`` inside ``node`` with stdout and stderr captured."""
    argv = [sys.executable, SCRIPT, *map(str, args)]
    return testbed.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def tcp_transfer(
    testbed: Any, sender: str, receiver: str, port: int, seconds: float, nbytes: int | None = None
) -> dict[str, Any]:
    """Bulk TCP from ``sender`` to ``receiver`` for ``seconds`` (or ``nbytes``); the
    receiver's ``bytes`` and ``seconds`` and its goodput ``mbit`` (Mbit/s)."""
    recv = start(testbed, receiver, "tcp-recv", port)
    testbed.wait_listening(receiver, port)
    send = start(
        testbed,
        sender,
        "tcp-send",
        testbed.address(receiver),
        port,
        seconds,
        *([nbytes] if nbytes is not None else []),
    )
    run(send)
    result = run(recv)
    result["mbit"] = result["bytes"] * 8 / result["seconds"] / 1e6
    return result


def main(argv: list[str]) -> None:
    mode, args = argv[0], argv[1:]
    if mode == "tcp-recv":
        result = tcp_recv(int(args[0]))
    elif mode == "tcp-send":
        result = tcp_send(
            args[0], int(args[1]), float(args[2]), int(args[3]) if len(args) > 3 else None
        )
    elif mode == "udp-recv":
        result = udp_recv(int(args[0]), int(args[1]), float(args[2]))
    elif mode == "udp-send":
        result = udp_send(args[0], int(args[1]), int(args[2]), float(args[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
