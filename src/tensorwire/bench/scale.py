"""``tensorwire bench scale``: one hub, many clients, on loopback, per transport.

For each transport and each client count N: a hub in a process of its own
(:mod:`tensorwire.bench.scale_case`, killed with its clients past the case's deadline); N
clients held by client processes, a thread each (``tensorwire.bench.scale_clients``):
``procs`` of them, or by default the transport's ``scale_procs`` (4 where a process's
clients share one I/O thread) or enough that none holds more than
:data:`CLIENTS_PER_PROC`. A transport name may carry URL options for its hub
(``amqp?persistent=0``). Timed there:

- ``join_s``: from starting the client processes until the hub counts N members;
- ``broadcast_s``: ``hub.broadcast`` of ``broadcast_bytes`` of float32 to all N;
- ``gather_s``: until the hub has received a ``reply_bytes`` reply from each;
- ``hub_cpu_s``: the hub process's CPU time (every thread) over join + broadcast + gather;
- ``clients_cpu_s``: the client processes' CPU time (all of them) over broadcast + gather;
- a private broker's CPU time (its process and those it started): ``broker_join_cpu_ms``
  per client over the join, ``broker_cpu_s`` over broadcast + gather;
- per client, with N clients joined, against the hub before any joined: ``rss_kb``,
  ``threads`` and ``fds`` (from its ``/proc/self``); and the hub's whole ``hub_threads``,
  ``hub_fds`` and ``hub_rss_mb`` then, with every client joined and idle.

``per_client_ms`` is (broadcast + gather) / N: flat as N grows when nothing grows faster
than N. Broker transports (mqtt, amqp) get a private broker for the run, never the
machine's own. Every case has a deadline (``timeout``) and ends its client processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl

from tensorwire.bench.progress import progress_bar
from tensorwire.errors import TransportError
from tensorwire.transports.local import local_hub_url
from tensorwire.transports.registry import get_transport
from tensorwire.transports.url import with_option

CLIENTS = (10, 100, 1000)
"""Client counts by default (``--clients`` goes to 5,000)."""
MAX_CLIENTS = 5000
BROADCAST_BYTES = 1 << 20
REPLY_BYTES = 100 << 10
PROCS = 4
"""The fewest client processes."""
CLIENTS_PER_PROC = 100
"""The most clients one client process holds, unless told ``procs``. A broadcast that reaches
every client at once (shm's does: its bytes are already there) wakes all of a process's
threads together, and they queue for its interpreter lock: measured at 1,000 shm clients,
4 processes of 250 spent 10 s of CPU (mostly futex waits, and the kernel's task switches) on
what 20 processes of 50 did in 1.2 s. That is the test harness's cost, not the hub's."""
MAX_PROCS = 64
TIMEOUT = 300.0
"""Seconds one case (a transport at one N) may take in all."""
CASE = ("-m", "tensorwire.bench.scale_case")
"""What runs a case (after the interpreter)."""
GRACE_S = 30.0
"""Seconds past its deadline a case's process may take to report before it is killed."""


def usage(pid: int | str = "self") -> dict[str, int]:
    """A process's (this one's by default) resident memory (KiB), threads and open file
    descriptors; empty if it has gone."""
    status = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.readlines()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {}
    for line in lines:
        key, _, value = line.partition(":")
        status[key] = value.split()[0] if value.split() else "0"
    return {
        "rss_kb": int(status.get("VmRSS", 0)),
        "threads": int(status.get("Threads", 0)),
        "fds": fds,
    }


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


@contextlib.contextmanager
def _private_hub_url(transport: str, devices: int) -> Iterator[tuple[str, int | None]]:
    """A hub URL on loopback, and None; a broker transport's on a private broker of its own,
    sized for ``devices``, and that broker's process id. ``transport`` may end in URL options
    (``amqp?persistent=0``), added to the URL."""
    name, _, query = transport.partition("?")
    broker = get_transport(name).broker_kind()
    if broker is None:
        with local_hub_url(name) as url:
            yield _with_options(url, query), None
        return
    with broker.load("server")(devices=devices) as server:
        yield _with_options(server.url(f"tw-scale-{os.getpid()}"), query), server.pid


def _with_options(url: str, query: str) -> str:
    for name, value in parse_qsl(query, keep_blank_values=True):
        url = with_option(url, name, value)
    return url


def with_descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a broker's start script and the runtime it
    starts), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        fields = _stat_fields(int(name)) if name.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def client_procs(n: int, procs: int | None = None, transport: str = "") -> int:
    """How many client processes hold ``n`` clients of ``transport``: ``procs`` if given, else
    the transport's ``scale_procs`` (:class:`~tensorwire.transports.registry.TransportEntry`:
    measured at 2,000 clients, medians of 3, mqtt's clients spent 9.6 s of CPU in 4 processes
    and 12.9 s in 20, and with amqp's in 4 RabbitMQ spent 7.3 ms of CPU per join instead of
    9.5; quic's channels share a loop too, but its joins took 12 ms per client in 4 processes
    against 7 in 20), else enough that each holds at most :data:`CLIENTS_PER_PROC` (at least
    :data:`PROCS`, at most :data:`MAX_PROCS`); never more than ``n``."""
    if procs is None and transport:
        procs = get_transport(transport.partition("?")[0]).scale_procs
    if procs is None:
        procs = min(MAX_PROCS, max(PROCS, -(-n // CLIENTS_PER_PROC)))
    return max(1, min(procs, n))


def cpu_seconds(pids: Sequence[int]) -> float:
    """The CPU time (user + system, every thread) the processes ``pids`` have used so far;
    one that has ended counts 0."""
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (state, ppid, ...), or None
    if the process has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def scale_case(
    transport: str,
    n: int,
    *,
    procs: int | None = None,
    broadcast_bytes: int = BROADCAST_BYTES,
    reply_bytes: int = REPLY_BYTES,
    timeout: float = TIMEOUT,
) -> dict[str, Any]:
    """One transport at ``n`` clients (see the module doc): a row of the table.

    The hub and its client processes run in a process group of their own
    (:mod:`tensorwire.bench.scale_case`), which keeps the case's deadline itself and is
    killed, all of it, if it is still running :data:`GRACE_S` past the deadline: a hub
    whose threads run away (flight's did, to 23,000) cannot hold up the run."""
    row: dict[str, Any] = {"transport": transport, "clients": n}
    with _private_hub_url(transport, n) as (url, broker):
        argv = [sys.executable, *CASE, url, str(n)]
        argv += [str(client_procs(n, procs, transport)), str(broadcast_bytes)]
        argv += [str(reply_bytes), str(timeout), str(broker or 0)]
        case = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, _ = case.communicate(timeout=timeout + GRACE_S)
        except subprocess.TimeoutExpired:
            threads = usage(case.pid).get("threads", 0)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(case.pid, signal.SIGKILL)  # the hub and its client processes
            case.communicate()
            row["error"] = (
                f"the case ran {GRACE_S:.0f} s past its {timeout:.0f} s deadline: its hub "
                f"({threads} threads) and client processes were killed"
            )
            return row
    try:
        fields = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        row["error"] = f"the case's process ended (exit code {case.returncode}) with no row"
        return row
    if "fatal" in fields:  # its hub could not start (a bad URL option, say): so would all
        raise TransportError(fields["fatal"])
    return row | fields


def bench_scale(
    transports: Sequence[str],
    clients: Sequence[int] = CLIENTS,
    repeat: int = 1,
    **case: Any,
) -> list[dict[str, Any]]:
    """Every transport at every client count, smallest first, ``repeat`` times with the runs
    interleaved (every case once, then every case again): a row per case and run (``run``
    counts from 1)."""
    raise_fd_limit()
    rows = []
    with progress_bar() as bar:
        task = bar.add_task("bench scale", total=repeat * len(transports) * len(clients))
        for run in range(1, repeat + 1):
            for transport in transports:
                for n in sorted(clients):
                    bar.update(task, description=f"run {run}/{repeat}: {transport}, {n} clients")
                    rows.append({"run": run} | scale_case(transport, n, **case))
                    bar.advance(task)
    return rows
