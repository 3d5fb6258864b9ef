"""``tensorwire bench collective``: allreduce over rank processes on loopback or on the
testbed's shaped links, tensorwire against gloo and MPI in the same run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from tensorwire.cli.console import console
from tensorwire.cli.logs import benchmark_hubs
from tensorwire.cli.options import results_dir, split_list, split_profiles

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20}
_SIZE = re.compile(r"^(\d+)\s*([a-z]*)$")

COLUMNS = [
    "link",
    "placed",
    "contender",
    "bytes",
    "iterations",
    "median_ms",
    "min_ms",
    "cpu_ms",
    "ring_bytes_per_rank",
    "bus_gb_per_s",
    "ring_bound_ms",
    "vs_ring_bound",
    "vs_gloo",
    "vs_mpi",
    "max_rel_error",
]
TESTBED_PROFILES = "100mbit,1gbit,4g,wifi"

LEGEND = (
    "link: loopback or the profile of every rank's own link; placed: where the ranks ran "
    "(netns: each in its own namespace behind its link); bytes: float32 per rank; "
    "iterations: allreduces per trial; median_ms / min_ms: wall time of one allreduce (the "
    "slowest rank's, a trial's mean), median / least over trials; cpu_ms: the process CPU "
    "time (all its threads) per allreduce of the busiest rank, median over trials (MPI spins "
    "while it waits); ring_bytes_per_rank: 2(N-1)/N x bytes, the least each rank must send; "
    "bus_gb_per_s: that / median; ring_bound_ms: that at the link's rate; vs_ring_bound: "
    "median / ring_bound_ms; vs_gloo, vs_mpi: median / gloo's, / mpi-tcp's in the same link "
    "(below 1 is faster); max_rel_error: one allreduce of random data, largest error / "
    "largest exact sum."
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
    algorithms: Annotated[
        str, typer.Option(help="tensorwire's allreduce algorithms: ring, doubling, or both.")
    ] = "ring,doubling",
    testbed: Annotated[
        bool,
        typer.Option(
            "--testbed",
            help="Run on the testbed: each rank in its own network namespace behind its own "
            f"link, shaped with each of --profiles in turn (default {TESTBED_PROFILES}).",
        ),
    ] = False,
    profiles: Annotated[
        str,
        typer.Option(
            help="Comma-separated link profiles for --testbed (implies it): 4g, wifi, lan, "
            "3g, or a rate such as 100mbit or 1gbit."
        ),
    ] = "",
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
) -> None:
    """Allreduce (sum, float32) over rank processes: tensorwire (ring, recursive doubling,
    each with every --compress) vs torch.distributed gloo vs MPI (mpi4py under mpirun), in
    the same run, on loopback or (--testbed) behind shaped links.

    Trials alternate between contenders; each row has the ring bound 2(N-1)/N x bytes and
    the bus bandwidth it implies, and on the testbed the time that bound allows at the
    link's rate. Contenders that cannot run here (no torch, no mpi4py or mpirun) are left
    out, and the run says why.
    """
    from tensorwire.bench.collective import bench_collective
    from tensorwire.bench.collective_figure import collective_figure
    from tensorwire.bench.progress import progress_bar
    from tensorwire.bench.tables import print_table, write_rows
    from tensorwire.testbed import TestbedError

    chosen = [parse_size(s) for s in split_list(sizes)]
    links = split_profiles(profiles or TESTBED_PROFILES) if testbed or profiles else None
    btls = split_list(mpi)
    for btl in btls:
        if btl not in ("tcp", "sm"):
            raise typer.BadParameter(f"{btl!r}: choose tcp or sm", param_hint="--mpi")
    try:
        with benchmark_hubs(say=links is None), progress_bar() as bar:
            task = bar.add_task("allreduce trials (the first round warms up)", total=None)
            rows, skipped = bench_collective(
                chosen,
                ranks=ranks,
                repeat=repeat,
                compress=split_list(compress),
                mpi_btls=btls,
                progress=lambda total: bar.update(task, total=total, advance=1),
                algorithms=split_list(algorithms),
                profiles=links,
                say=console.print,
            )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    except TestbedError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    where = "on loopback" if links is None else "each behind its own shaped link (testbed)"
    title = f"Allreduce (sum, float32) over {ranks} ranks {where}, median of {repeat}"
    print_table(rows, title, COLUMNS, console)
    console.print(LEGEND)
    for name, reason in skipped.items():
        console.print(f"[yellow]{name} left out[/]: {reason}")
    out_dir = results_dir(out, "bench-collective")
    paths = write_rows(rows, out_dir, "collective") + collective_figure(rows, out_dir)
    console.print(f"results: {', '.join(str(p) for p in paths)}")
