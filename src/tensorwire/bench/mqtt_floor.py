"""Mosquitto's own floor for ``bench scale``'s mqtt rows: the same work with minimal clients.

``python -m tensorwire.bench.mqtt_floor --clients 100,2000``: a private Mosquitto sized for N
devices; N MQTT 3.1.1 clients on raw sockets (:mod:`~tensorwire.bench.mqtt_floor_clients`, in
processes of at most 100, as ``bench scale``'s); one PUBLISH of ``broadcast`` bytes that all N
get, and a ``reply`` of bytes from each to one subscriber. ``per_client_ms`` is the wall time
from the broadcast until the subscriber has every reply, over N; ``broker_cpu_s`` the broker's
CPU meanwhile. What no MQTT client can do faster on this broker: ``bench scale``'s mqtt
``per_client_ms`` over this is what tensorwire's clients and hub add.
"""

from __future__ import annotations

import argparse
import selectors
import subprocess
import sys
import time
from typing import Any

from tensorwire._children import close_and_reap
from tensorwire.bench.mqtt_floor_clients import DOWN, UP, PacketReader, dial
from tensorwire.bench.scale import PROCS, client_procs, cpu_seconds, raise_fd_limit
from tensorwire.bench.scale_summary import median_rows
from tensorwire.bench.tables import print_table
from tensorwire.transports.brokers.mosquitto import MosquittoBroker
from tensorwire.transports.brokers.mqtt_packets import publish_header

TIMEOUT = 120.0


def floor_case(
    n: int, qos: int = 1, broadcast: int = 1 << 20, reply: int = 100 << 10, timeout: float = TIMEOUT
) -> dict[str, Any]:
    """One run at ``n`` clients: a row of the table."""
    with MosquittoBroker(devices=n) as broker:
        assert broker.pid is not None
        procs, first, spawned = client_procs(n, PROCS), 0, []  # as bench scale holds mqtt clients
        share, extra = divmod(n, procs)
        try:
            for p in range(procs):
                count = share + (p < extra)
                argv = [sys.executable, "-m", "tensorwire.bench.mqtt_floor_clients"]
                argv += [str(broker.port), str(first), str(count), str(qos), str(reply)]
                spawned.append(
                    subprocess.Popen(
                        [*argv, str(timeout)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
                first += count
            hub = dial(broker.port, "tw-floor-hub", UP, qos, timeout)
            publisher = dial(broker.port, "tw-floor-pub", None, qos, timeout)
            for proc in spawned:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            cpu0, t0 = cpu_seconds([broker.pid]), time.monotonic()
            publisher.sendall(publish_header(DOWN, broadcast, qos) + bytes(broadcast))
            got = _gather(hub, n, reply, t0 + timeout)
            seconds, cpu = time.monotonic() - t0, cpu_seconds([broker.pid]) - cpu0
        finally:
            for proc in spawned:
                close_and_reap(proc, 30)
    row: dict[str, Any] = {"transport": "mosquitto-raw", "clients": n, "client_procs": procs}
    if got < n:
        row["error"] = f"{got} of {n} replies within {timeout} s"
        return row
    return row | {"per_client_ms": 1000 * seconds / n, "broker_cpu_s": cpu}


def _gather(hub: Any, n: int, reply: int, deadline: float) -> int:
    """Replies (PUBLISHes of ``reply`` bytes or more) the hub's socket gets, up to ``n``."""
    hub.setblocking(False)
    reader, selector, got = PacketReader(hub), selectors.DefaultSelector(), 0
    selector.register(hub, selectors.EVENT_READ)
    while got < n and time.monotonic() < deadline:
        if selector.select(1.0):
            for first, head, length in reader.packets():
                if first >> 4 == 3 and length >= reply:
                    reader.ack(first, head)
                    got += 1
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorwire.bench.mqtt_floor")
    parser.add_argument("--clients", default="100,2000", help="comma-separated client counts")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every count, interleaved")
    parser.add_argument("--qos", type=int, default=1, choices=(0, 1))
    args = parser.parse_args(argv)
    raise_fd_limit()
    counts = sorted(int(c) for c in args.clients.split(","))
    rows = [floor_case(n, args.qos) for _ in range(args.repeat) for n in counts]
    columns = ["transport", "clients", "runs", "per_client_ms", "per_client_ratio", "broker_cpu_s"]
    print_table(
        median_rows(rows), f"Mosquitto with raw clients (medians of {args.repeat})", columns
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
