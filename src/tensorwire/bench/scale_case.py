"""One case of ``tensorwire bench scale`` (:mod:`tensorwire.bench.scale`), in a process of
its own: the hub, its client processes (:mod:`tensorwire.bench.scale_clients`), and what
is timed and counted of them; the fields are printed as one JSON line.

``python -m tensorwire.bench.scale_case URL N PROCS BROADCAST_BYTES REPLY_BYTES TIMEOUT
BROKER_PID``

The case keeps its own deadline; the bench kills this process's group (the hub and its
clients) if it has not reported shortly after, so that a hub whose threads run away
cannot hold up the run.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import tensorwire
from tensorwire.bench.scale import cpu_seconds, raise_fd_limit, usage, with_descendants
from tensorwire.errors import TensorwireError, TransportError

ERROR_CHARS = 400
"""A failed case's error is cut to this many characters in the table."""


def _spawn(url: str, n: int, procs: int, reply_bytes: int, timeout: float) -> list[Any]:
    share, extra = divmod(n, procs)
    spawned, first = [], 0
    for p in range(procs):
        count = share + (1 if p < extra else 0)
        if count == 0:
            continue
        argv = [sys.executable, "-m", "tensorwire.bench.scale_clients", url]
        argv += [str(first), str(count), str(reply_bytes), str(timeout)]
        spawned.append(
            subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
        first += count
    return spawned


def wait_line(stream: Any, deadline: float) -> str:
    """The next line of ``stream`` (a pipe), stripped; TransportError past ``deadline``."""
    ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise TransportError("a client process said nothing by the case's deadline")
    return str(stream.readline()).strip()


def _start(procs: Sequence[Any], deadline: float) -> None:
    """Wait for every client process to be ready (imported), then start them all."""
    for proc in procs:
        ready = wait_line(proc.stdout, deadline)
        if ready != "ready":
            raise TransportError(f"client process {proc.pid} did not start: {ready!r}")
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _tallies(procs: Sequence[Any], deadline: float) -> dict[str, Any]:
    total: dict[str, Any] = {"connected": 0, "replied": 0, "finished": 0, "failed": 0}
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            tally = json.loads(out.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            proc.kill()
            proc.wait()
            total["failed"] += 1
            total.setdefault("error", f"client process {proc.pid} gave no tally")
            continue
        for key in ("connected", "replied", "finished", "failed"):
            total[key] += int(tally.get(key, 0))
        if "error" in tally:
            total.setdefault("error", tally["error"])
    return total


def run_case(
    url: str,
    n: int,
    procs: int,
    broadcast_bytes: int,
    reply_bytes: int,
    timeout: float,
    broker: int | None,
) -> dict[str, Any]:
    """The hub at ``url`` and ``n`` clients in ``procs`` processes, by ``timeout`` seconds:
    the case's measured fields (``error`` if it failed); ``broker``: a private broker's
    process id, whose CPU time is counted."""
    deadline = time.monotonic() + timeout
    row: dict[str, Any] = {}
    with tensorwire.serve(url, codec=None) as hub:
        brokers = [] if broker is None else with_descendants(broker)
        before = usage()
        procs_ = _spawn(hub.url, n, procs, reply_bytes, timeout)
        pids = [p.pid for p in procs_]
        t2, gathered = 0.0, 0
        try:
            _start(procs_, deadline)
            cpu0, broker_cpu0 = time.process_time(), cpu_seconds(brokers)
            t0 = time.monotonic()
            hub.wait_for(n, timeout=deadline - time.monotonic())
            t1 = time.monotonic()
            broker_cpu1 = cpu_seconds(brokers)
            held = usage()
            clients_cpu0 = cpu_seconds(pids)
            weights = np.ones(broadcast_bytes // 4, np.float32)
            hub.broadcast({"w": weights}, timeout=deadline - time.monotonic())
            t2 = time.monotonic()
            for gathered in range(n):  # noqa: B007 (named in the error below)
                hub.recv(timeout=deadline - time.monotonic())
            t3 = time.monotonic()
            cpu = time.process_time() - cpu0
            clients_cpu = cpu_seconds(pids) - clients_cpu0
            broker_cpu3 = cpu_seconds(brokers)
            hub.broadcast(meta={"done": True}, timeout=deadline - time.monotonic())
        except TransportError as exc:  # its text may list thousands of client ids: cut short
            row["error"] = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
            if t2:  # the broadcast went out: say how far the gather got
                row["error"] += f" (after {gathered} of {n} replies)"
        finally:
            tally = _tallies(procs_, deadline)
    if "error" in row:
        row["error"] += f" (clients: {tally})"
        return row
    row.update(
        join_s=t1 - t0,
        join_ms_per_client=1000 * (t1 - t0) / n,
        broadcast_s=t2 - t1,
        gather_s=t3 - t2,
        per_client_ms=1000 * (t3 - t1) / n,
        hub_cpu_s=cpu,
        clients_cpu_s=clients_cpu,
        client_procs=len(pids),
        rss_kb_per_client=(held["rss_kb"] - before["rss_kb"]) / n,
        threads_per_client=(held["threads"] - before["threads"]) / n,
        fds_per_client=(held["fds"] - before["fds"]) / n,
        hub_threads=held["threads"],
        hub_fds=held["fds"],
        hub_rss_mb=held["rss_kb"] / 1024,
        clients_failed=tally["failed"],
    )
    if brokers:
        row["broker_join_cpu_ms"] = 1000 * (broker_cpu1 - broker_cpu0) / n
        row["broker_cpu_s"] = broker_cpu3 - broker_cpu1
    if tally["failed"]:
        row["clients_error"] = str(tally.get("error", ""))[:ERROR_CHARS]
    return row


def main(argv: Sequence[str]) -> None:
    """``URL N PROCS BROADCAST_BYTES REPLY_BYTES TIMEOUT BROKER_PID``: print the
    case's fields as one JSON line (BROKER_PID 0: no broker), and end at once: the hub is
    closed and its clients have ended, and a library's finalizers at exit (pyarrow Flight's
    have hung) must not hold the bench."""
    url, n, procs, broadcast, reply, timeout, broker = argv
    raise_fd_limit()
    try:
        row = run_case(
            url, int(n), int(procs), int(broadcast), int(reply), float(timeout), int(broker) or None
        )
    except TensorwireError as exc:  # the hub did not start: the bench stops, saying why
        row = {"fatal": str(exc)}
    print(json.dumps(row), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
