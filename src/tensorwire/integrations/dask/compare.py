"""Dask's tcp:// against tensorwire+tcp:// on one workload, same run, trials interleaved.

``python -m tensorwire.integrations.dask.compare [--n 16384] [--trials 5] [--values rounded]``
starts one LocalCluster per protocol (scheduler and 2 worker processes, 127.0.0.1 only), and
per trial rechunks an ``n x n`` float64 array generated on the workers from column blocks to
row blocks and sums it (about half its bytes move worker to worker), on each cluster in turn.
Prints per protocol the median wall seconds of the compute, the bytes the workers received
from each other per trial (Dask's own transfer log), and the ratio to tcp.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def _moved(client: Any) -> int:
    logs = client.run(
        lambda dask_worker: sum(t["total"] for t in dask_worker.transfer_incoming_log)
    )
    return int(sum(logs.values()))


def _workload(n: int, values: str) -> Any:
    import dask.array as da

    x = da.random.default_rng(0).random((n, n), chunks=(n, n // 16))
    if values == "rounded":  # two decimals, as measured values often are: compressible
        x = da.round(x * 100) / 100
    # task-based rechunk: its transfers go through the comm and Dask's transfer log (the P2P
    # rechunk Dask picks for big arrays moves shards by RPC, outside that log)
    return x.rechunk((n // 16, n), method="tasks").sum()


def _connect(protocols: list[str], schedulers: str | None) -> tuple[dict[str, Any], list[Any]]:
    """A client per protocol: of a LocalCluster started here, or of the running scheduler
    ``schedulers`` names for it (``proto=address,...``, with 2 workers); and what to close."""
    from distributed import Client, LocalCluster

    given = dict(item.split("=", 1) for item in schedulers.split(",")) if schedulers else {}
    clients: dict[str, Any] = {}
    closers: list[Any] = []
    for proto in protocols:
        if proto in given:
            clients[proto] = Client(given[proto], timeout=120)
            clients[proto].wait_for_workers(2, timeout=300)
        else:
            cluster = LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                protocol=proto + "://",
                host="127.0.0.1",
                dashboard_address=None,
                memory_limit="6GiB",
            )
            closers.append(cluster)
            clients[proto] = Client(cluster)
        closers.insert(0, clients[proto])
    return clients, closers


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--values", choices=["random", "rounded"], default="random")
    p.add_argument("--protocols", default="tcp,tensorwire+tcp")
    p.add_argument("--schedulers", help="proto=address,...: running schedulers to use")
    p.add_argument("--where", default="loopback", help="what the table says the links were")
    args = p.parse_args(argv)
    protocols = args.protocols.split(",")
    clients, closers = _connect(protocols, args.schedulers)
    secs: dict[str, list[float]] = {p: [] for p in protocols}
    moved: dict[str, list[int]] = {p: [] for p in protocols}
    try:
        for _ in range(args.trials):
            for proto in protocols:
                client = clients[proto]
                before = _moved(client)
                t0 = time.perf_counter()
                client.compute(_workload(args.n, args.values)).result()
                secs[proto].append(time.perf_counter() - t0)
                moved[proto].append(_moved(client) - before)
    finally:
        for closer in closers:
            closer.close()
    base = statistics.median(secs[protocols[0]])
    print(
        f"{args.n}x{args.n} float64 ({args.values}), rechunk cols->rows + sum, 2 workers, "
        f"{args.where}; medians of {args.trials} interleaved trials"
    )
    print(
        f"{'protocol':<16}{'wall s (median)':>16}{'min':>8}{'max':>8}"
        f"{'GB moved/trial':>16}{'vs ' + protocols[0]:>10}"
    )
    for proto in protocols:
        s = secs[proto]
        med = statistics.median(s)
        gb = statistics.median(moved[proto]) / 1e9
        print(f"{proto:<16}{med:>16.2f}{min(s):>8.2f}{max(s):>8.2f}{gb:>16.2f}{med / base:>10.2f}")


if __name__ == "__main__":
    main()
