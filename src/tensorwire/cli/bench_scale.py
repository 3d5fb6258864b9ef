"""``tensorwire bench scale``: one hub and many clients per transport, on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tensorwire.cli.console import console
from tensorwire.cli.logs import benchmark_hubs
from tensorwire.cli.options import results_dir, split_list, transport_names

COLUMNS = [
    "transport",
    "clients",
    "runs",
    "join_s",
    "join_ms_per_client",
    "broadcast_s",
    "gather_s",
    "per_client_ms",
    "per_client_ratio",
    "hub_cpu_s",
    "clients_cpu_s",
    "broker_join_cpu_ms",
    "broker_cpu_s",
    "client_procs",
    "rss_kb_per_client",
    "threads_per_client",
    "fds_per_client",
    "hub_threads",
    "hub_fds",
    "hub_rss_mb",
    "clients_failed",
]

LEGEND = (
    "Each number: the median over the case's finished runs (runs). "
    "join_s, broadcast_s, gather_s: wall time of the whole step for all clients; "
    "join_ms_per_client: join_s / clients; per_client_ms: (broadcast + gather) / clients; "
    "per_client_ratio: per_client_ms / that of the transport's smallest client count; "
    "hub_cpu_s: the hub process's CPU over the three steps; clients_cpu_s: all client "
    "processes' CPU over broadcast and gather; broker_join_cpu_ms, broker_cpu_s: a private "
    "broker's CPU per client over the join (ms), and over broadcast and gather (s); "
    "client_procs: how many held the clients; "
    "rss_kb, threads, fds per client: the hub process's growth with every client joined / "
    "clients; hub_threads, hub_fds, hub_rss_mb: the hub process's totals then (every client "
    "joined, idle)."
)


def bench_scale_cmd(
    transports: Annotated[
        str,
        typer.Option(
            help="Comma-separated transports (tcp, zmq, udp, quic, ...), each with URL options "
            "for its hub if wanted (amqp?persistent=0)."
        ),
    ] = "tcp,zmq,udp,quic,flight,mqtt",
    clients: Annotated[
        str, typer.Option(help="Comma-separated client counts, 1 to 5000.")
    ] = "10,100,1000",
    procs: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Client processes holding the clients (default: 4 for mqtt and amqp, whose "
            "clients in a process share one I/O thread; else enough that none holds over 100, "
            "at least 4).",
        ),
    ] = None,
    broadcast_kib: Annotated[int, typer.Option(min=1, help="Broadcast size, KiB.")] = 1024,
    reply_kib: Annotated[int, typer.Option(min=1, help="Each client's reply, KiB.")] = 100,
    timeout: Annotated[
        float, typer.Option(min=10, help="Seconds one case (a transport at a count) may take.")
    ] = 300.0,
    repeat: Annotated[
        int,
        typer.Option(
            min=1, max=10, help="Runs of every case, interleaved; the table shows medians."
        ),
    ] = 1,
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
) -> None:
    """One hub, many clients: join, broadcast and gather time and the hub's memory, threads
    and descriptors per client, for each transport and client count (loopback)."""
    from tensorwire.bench.scale import MAX_CLIENTS, bench_scale
    from tensorwire.bench.scale_figure import scale_figure
    from tensorwire.bench.scale_summary import median_rows
    from tensorwire.bench.tables import print_table, write_rows

    names = split_list(transports)
    known = transport_names()
    unknown = [t for t in names if t.partition("?")[0] not in known]
    if unknown:
        raise typer.BadParameter(
            f"unknown transport(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    try:
        counts = [int(c) for c in split_list(clients)]
    except ValueError:
        raise typer.BadParameter(f"{clients!r} is not a list of counts like 10,100,1000") from None
    if not counts or not all(1 <= c <= MAX_CLIENTS for c in counts):
        raise typer.BadParameter(f"client counts must be 1 to {MAX_CLIENTS}, not {clients!r}")
    with benchmark_hubs():
        rows = bench_scale(
            names,
            counts,
            procs=procs,
            broadcast_bytes=broadcast_kib << 10,
            reply_bytes=reply_kib << 10,
            timeout=timeout,
            repeat=repeat,
        )
    medians = median_rows(rows)
    good = [r for r in medians if "error" not in r]
    runs = "one run per case" if repeat == 1 else f"medians of {repeat} interleaved runs per case"
    print_table(good, f"One hub, many clients (loopback; {runs})", COLUMNS, console)
    console.print(f"[dim]{LEGEND}[/]")
    for r in rows:
        if "error" in r:
            console.print(
                f"[red]{r['transport']} at {r['clients']} clients (run {r['run']}):[/] {r['error']}"
            )
        elif r.get("clients_error"):
            console.print(
                f"[yellow]{r['transport']} at {r['clients']} clients (run {r['run']}): "
                f"{r['clients_failed']} "
                f"failed[/], the first: {r['clients_error']}"
            )
    out_dir = results_dir(out, "bench-scale")
    paths = write_rows(rows, out_dir, "scale")
    paths += write_rows(medians, out_dir, "scale-medians")
    if good:
        paths += scale_figure(good, out_dir)
    console.print(f"results: {', '.join(str(p) for p in paths)}")
