"""``tensorwire bench collective``: allreduce over rank processes on loopback, tensorwire
against gloo and MPI in the same run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from tensorwire.cli.console import console
from tensorwire.cli.logs import benchmark_hubs
from tensorwire.cli.options import results_dir, split_list

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20}
_SIZE = re.compile(r"^(\d+)\s*([a-z]*)$")

COLUMNS = [
    "contender",
    "bytes",
    "iterations",
    "median_ms",
    "min_ms",
    "cpu_ms",
    "ring_bytes_per_rank",
    "bus_gb_per_s",
    "vs_gloo",
    "vs_mpi",
]

LEGEND = (
    "bytes: float32 per rank; iterations: allreduces per trial; median_ms / min_ms: the "
    "slowest rank's time per allreduce over trials; cpu_ms: the process CPU time (all its "
    "threads) per allreduce of the busiest rank, median over trials (MPI spins while it "
    "waits); ring_bytes_per_rank: 2(N-1)/N x bytes, "
    "the least each rank must send; bus_gb_per_s: that / median; vs_gloo, vs_mpi: median "
    "time / gloo's, / mpi-tcp's (below 1 is faster)."
)


def parse_size(text: str) -> int:
    """``4KiB``, ``64MiB`` or a byte count."""
    match = _SIZE.match(text.strip().lower())
    if not match or match.group(2) not in _UNITS:
        raise typer.BadParameter(f"{text!r} is not a size like 4KiB, 64MiB or 4096")
    return int(match.group(1)) * _UNITS[match.group(2)]


def bench_collective_cmd(
    sizes: Annotated[
        str,
        typer.Option(help="Comma-separated float32 bytes per rank, 4KiB to 256MiB."),
    ] = "4KiB,64KiB,1MiB,16MiB,64MiB",
    ranks: Annotated[int, typer.Option(min=2, max=8, help="Ranks (processes) per job.")] = 4,
    repeat: Annotated[
        int, typer.Option(min=1, help="Timed trials per case, interleaved (median reported).")
    ] = 5,
    compress: Annotated[
        str,
        typer.Option(
            help="Comma-separated compress= options of Group.allreduce to run beside the "
            "uncompressed ones (none by default)."
        ),
    ] = "",
    mpi: Annotated[
        str,
        typer.Option(
            help="MPI's byte transfer layers to run: tcp (over lo, as the others), sm "
            "(shared memory), or both; '' for none."
        ),
    ] = "tcp",
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
) -> None:
    """Allreduce (sum, float32) over rank processes on loopback: tensorwire (ring, recursive
    doubling) vs torch.distributed gloo vs MPI (mpi4py under mpirun), in the same run.

    Trials alternate between contenders; each row has the ring bound 2(N-1)/N x bytes and
    the bus bandwidth it implies. Contenders that cannot run here (no torch, no mpi4py or
    mpirun) are left out, and the run says why. Loopback only: shaped links in the
    testbed's namespaces are later work.
    """
    from tensorwire.bench.collective import bench_collective
    from tensorwire.bench.collective_figure import collective_figure
    from tensorwire.bench.progress import progress_bar
    from tensorwire.bench.tables import print_table, write_rows

    chosen = [parse_size(s) for s in split_list(sizes)]
    btls = split_list(mpi)
    for btl in btls:
        if btl not in ("tcp", "sm"):
            raise typer.BadParameter(f"{btl!r}: choose tcp or sm", param_hint="--mpi")
    try:
        with benchmark_hubs(), progress_bar() as bar:
            task = bar.add_task("allreduce trials (the first round warms up)", total=None)
            rows, skipped = bench_collective(
                chosen,
                ranks=ranks,
                repeat=repeat,
                compress=split_list(compress),
                mpi_btls=btls,
                progress=lambda total: bar.update(task, total=total, advance=1),
            )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    title = f"Allreduce (sum, float32) over {ranks} ranks on loopback, median of {repeat}"
    print_table(rows, title, COLUMNS, console)
    console.print(LEGEND)
    for name, reason in skipped.items():
        console.print(f"[yellow]{name} left out[/]: {reason}")
    out_dir = results_dir(out, "bench-collective")
    paths = write_rows(rows, out_dir, "collective") + collective_figure(rows, out_dir)
    console.print(f"results: {', '.join(str(p) for p in paths)}")
