"""``tensorwire bench``: the microbenchmarks that compare with a baseline in the same run
(transfer, latency, codec, stream, collective, scale), and ``bench fl``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tensorwire.cli.bench_collective import bench_collective_cmd
from tensorwire.cli.bench_fl import bench_fl_cmd
from tensorwire.cli.bench_scale import bench_scale_cmd
from tensorwire.cli.console import console
from tensorwire.cli.logs import benchmark_hubs
from tensorwire.cli.options import parse_shape, results_dir, split_list, transports_option
from tensorwire.transports.registry import listed_transports as registered_transports

bench_app = typer.Typer(
    help="Benchmarks that compare with a baseline in the same run.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@bench_app.command("transfer")
def bench_transfer_cmd(
    transports: Annotated[
        str,
        typer.Option(
            help="Comma-separated transports (names or schemes), or 'all' (every registered one)."
        ),
    ] = "all",
    baselines: Annotated[
        str,
        typer.Option(
            help="Comma-separated baselines (tensorwire.bench.baselines), or 'auto': "
            "the libraries the chosen transports wrap."
        ),
    ] = "auto",
    repeat: Annotated[int, typer.Option(min=1, help="Timed runs per case (median reported).")] = 7,
    dtypes: Annotated[
        str, typer.Option(help="Comma-separated dtypes.")
    ] = "float16,float32,float64",
    shapes: Annotated[
        str, typer.Option(help="Comma-separated shapes.")
    ] = "100x100,200x200,500x500,1000x1000,3000x3000",
    big_mib: Annotated[int, typer.Option(help="Size of the throughput case, MiB (0 skips).")] = 128,
    rss_gib: Annotated[
        float, typer.Option(help="Tensor size for the receiver-memory case, GiB (0 skips).")
    ] = 1.0,
    codec: Annotated[
        str, typer.Option(help="tensorwire codec: auto, none, lz4, zstd, ...")
    ] = "auto",
    tls: Annotated[
        bool,
        typer.Option(
            help="Also run every transport secured (TLS or its own encryption + device keys) "
            "and compare with it unsecured."
        ),
    ] = False,
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
) -> None:
    """Every transport vs the libraries used directly: GSoC table, throughput, receiver memory."""
    from tensorwire.bench.figures import transfer_figure
    from tensorwire.bench.tables import print_table, write_rows
    from tensorwire.bench.transfer import (
        bench_receiver_memory,
        bench_transfer,
        wrapped_libraries,
    )

    chosen = transports_option(transports)
    if baselines == "auto":
        base = wrapped_libraries(chosen)
    else:
        from tensorwire.bench.baselines import resolve

        try:
            base = [resolve(name) for name in split_list(baselines)]
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--baselines") from None
    with benchmark_hubs():
        rows = bench_transfer(
            transports=chosen,
            baseline_modules=base,
            dtypes=split_list(dtypes),
            shapes=[parse_shape(s) for s in split_list(shapes)],
            repeat=repeat,
            big_mib=big_mib,
            codec=None if codec.lower() in ("none", "raw") else codec,
            tls=tls,
        )
    cols = [
        "case",
        "transport",
        "dtype",
        "shape",
        "bytes",
        "median_ms",
        "gb_per_s",
        "baseline",
        "vs_baseline",
    ]
    print_table(rows, f"Transfer over loopback, median of {repeat} runs", cols, console)
    _print_targets(rows, big_mib)
    out_dir = results_dir(out, "bench-transfer")
    paths = write_rows(rows, out_dir, "transfer") + transfer_figure(rows, out_dir)
    if rss_gib > 0:
        with benchmark_hubs(say=False):  # said before the table
            mem = bench_receiver_memory(rss_gib)
        growth_gib = mem["rss_growth_bytes"] / (1 << 30)
        verdict = "[green]met[/]" if mem["growth_per_byte"] <= 1.25 else "[red]missed[/]"
        console.print(
            f"receiver of a {rss_gib:g} GiB tensor: peak RSS grew {growth_gib:.3f} GiB "
            f"({mem['growth_per_byte']:.3f}x the tensor; target <= 1.25x: {verdict})"
        )
        paths += write_rows([mem], out_dir, "receiver_memory")
    console.print(f"results: {', '.join(str(p) for p in paths)}")


def _verdict(ratio: float | None, target: float) -> str:
    if ratio is None:
        return "[yellow]not measured[/]"
    return f"{ratio:.2f}x " + ("[green]met[/]" if ratio >= target else "[red]missed[/]")


def _print_targets(rows: list[dict], big_mib: int) -> None:
    """The targets the issues set, each from pairs of trials in this run."""
    from tensorwire.bench.transfer import paired_ratio

    big = {"case": "throughput"}
    small = {"case": "gsoc", "dtype": "float32", "shape": "100x100"}
    checks = [
        (
            f"tcp vs raw socket, {big_mib} MiB float32 (target >= 0.95x)",
            0.95,
            paired_ratio(rows, "raw-socket", "tensorwire-tcp", **big),
        ),
        (
            "tcp vs raw socket, 100x100 float32 (target >= 0.6x)",
            0.6,
            paired_ratio(rows, "raw-socket", "tensorwire-tcp", **small),
        ),
    ]
    at = {"case": "gsoc", "dtype": "float64", "shape": "3000x3000"}
    for lib in ("pyzmq", "pyarrow-flight"):
        checks.append(
            (
                f"tcp vs {lib}, 3000x3000 float64 (target >= 2x)",
                2.0,
                paired_ratio(rows, lib, "tensorwire-tcp", **at),
            )
        )
    # each transport's own target against the library it wraps (issue 3: 0.9x)
    targets = {e.label: e.baseline_target for e in registered_transports() if e.baseline_target}
    for r in rows:
        target = targets.get(r["transport"])
        if target and r["vs_baseline"] is not None and all(r[k] == v for k, v in at.items()):
            checks.append(
                (
                    f"{r['transport']} vs {r['baseline']}, 3000x3000 float64 "
                    f"(target >= {target:g}x)",
                    target,
                    r["vs_baseline"],
                )
            )
    for label, target, ratio in checks:
        console.print(f"{label}: {_verdict(ratio, target)}")


@bench_app.command("latency")
def bench_latency_cmd(
    payloads: Annotated[
        str, typer.Option(help="Comma-separated payload sizes, bytes (float32 tensors).")
    ] = "4096,40960",
    round_trips: Annotated[int, typer.Option(min=1, help="Round trips per timed block.")] = 2000,
    repeat: Annotated[
        int, typer.Option(min=5, help="Blocks per trial, interleaved (median reported).")
    ] = 7,
    codec: Annotated[
        str, typer.Option(help="tensorwire codec: auto, none, lz4, zstd, ...")
    ] = "auto",
    checksum_off: Annotated[
        bool, typer.Option(help="Also run tensorwire tcp without checksums (their cost).")
    ] = True,
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
) -> None:
    """Small-message ping-pong: raw socket, tensorwire tcp, pyzmq, tensorwire zmq+tcp.

    Per round trip: the wall time, and each side's CPU time (this process's, the echo
    process's), microseconds.
    """
    from tensorwire.bench.latency import bench_latency, latency_targets
    from tensorwire.bench.tables import print_table, write_rows

    try:
        sizes = [int(p) for p in split_list(payloads)]
    except ValueError:
        raise typer.BadParameter(
            f"{payloads!r} is not a list of byte counts like 4096,40960"
        ) from None
    with benchmark_hubs():
        rows = bench_latency(
            payloads=sizes,
            round_trips=round_trips,
            repeat=repeat,
            codec=None if codec.lower() in ("none", "raw") else codec,
            checksum_off=checksum_off,
        )
    cols = [
        "transport",
        "bytes",
        "median_us",
        "p99_us",
        "min_us",
        "hub_cpu_us",
        "echo_cpu_us",
        "baseline",
        "time_vs_baseline",
        "target",
    ]
    title = f"Round trips over loopback, median of {repeat} blocks of {round_trips}"
    print_table(rows, title, cols, console)
    for label, target, ratio in latency_targets(rows):
        if ratio is None:
            verdict = "[yellow]not measured[/]"
        else:
            verdict = f"{ratio:.2f}x " + ("[green]met[/]" if ratio <= target else "[red]missed[/]")
        console.print(f"{label}: {verdict}")
    out_dir = results_dir(out, "bench-latency")
    paths = write_rows(rows, out_dir, "latency")
    console.print(f"results: {', '.join(str(p) for p in paths)}")


@bench_app.command("codec")
def bench_codec_cmd(
    repeat: Annotated[int, typer.Option(min=1, help="Timed runs per case (median reported).")] = 5,
    models: Annotated[
        str,
        typer.Option(
            help="Comma-separated models whose trained weights to compress (vgg5, vgg8, "
            "resnet18), or 'none' to skip them."
        ),
    ] = "vgg5,vgg8,resnet18",
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
) -> None:
    """floatplanes(-zl) vs zipnn / blosc2 / zstd / lz4 on trained weights and round-to-round
    deltas; tensorwire codecs vs the libraries called directly (the Dask case); auto."""
    from tensorwire.bench.codec import bench_auto_incompressible, bench_codecs
    from tensorwire.bench.codec_weights import MODELS, bench_weights
    from tensorwire.bench.tables import print_table, write_rows

    chosen = [] if models.strip().lower() == "none" else split_list(models)
    unknown = sorted(set(chosen) - set(MODELS))
    if unknown:
        raise typer.BadParameter(
            f"unknown model {', '.join(unknown)}; choose from {', '.join(MODELS)} or none",
            param_hint="--models",
        )
    out_dir = results_dir(out, "bench-codec")
    paths = []
    if chosen:
        weights = bench_weights(tuple(chosen), repeat, progress=console.print)
        print_table(
            weights,
            f"trained weights and deltas (XOR of two checkpoints one epoch apart), one thread, "
            f"median of {repeat} interleaved runs; ratio = raw / compressed bytes; GB/s = raw "
            "GB per CPU second of this process",
            [
                "model",
                "dtype",
                "data",
                "codec",
                "raw_MB",
                "ratio",
                "compress_GBps",
                "decompress_GBps",
            ],
            console,
        )
        paths += write_rows(weights, out_dir, "weights")
    rows = bench_codecs(repeat)
    cols = [
        "codec",
        "ratio",
        "encode_ms",
        "library_encode_ms",
        "encode_vs_library",
        "decode_ms",
        "library_decode_ms",
        "decode_vs_library",
        "message_encode_ms",
        "message_decode_ms",
    ]
    print_table(
        rows,
        f"np.ones((4096, 4096)) float64, 128 MiB, median of {repeat}; ratio = compressed / raw",
        cols,
        console,
    )
    auto = bench_auto_incompressible(repeat)
    print_table(
        [auto],
        "auto on np.random.random((4096, 4096)), interleaved with raw, medians",
        [
            "codec",
            "select_ms",
            "auto_encode_ms",
            "raw_encode_ms",
            "auto_vs_raw",
            "wire_ms_at_bandwidth",
        ],
        console,
    )
    paths += write_rows(rows, out_dir, "codec") + write_rows([auto], out_dir, "auto")
    console.print(f"results: {', '.join(str(p) for p in paths)}")


@bench_app.command("stream")
def bench_stream_cmd(
    transports: Annotated[
        str,
        typer.Option(
            help="Comma-separated transports whose streams to measure (names or schemes), or 'all'."
        ),
    ] = "tcp,zmq,flight",
    records: Annotated[
        int, typer.Option(min=1, help="Rows per batch (x columns x 8 bytes: 4096 -> 128 KiB).")
    ] = 4096,
    columns: Annotated[int, typer.Option(min=1, help="int64 columns per batch.")] = 4,
    batches: Annotated[int, typer.Option(min=1, help="Batches per stream.")] = 1000,
    streams: Annotated[int, typer.Option(min=1, help="Streams at once.")] = 1,
    window: Annotated[int, typer.Option(min=1, help="Batches in flight per stream.")] = 16,
    repeat: Annotated[int, typer.Option(min=1, help="Trials per contender (median).")] = 5,
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
) -> None:
    """Record batches one way: each transport's streams vs pyarrow Flight DoGet, same run.

    The Arrow Flight benchmark's workload; MB/s, batches/s, each batch's wait p50 / p95 /
    p99 / max and each side's CPU per batch (microseconds), medians over interleaved trials,
    sender and receiver pinned to different CPUs.
    """
    from tensorwire.bench.progress import progress_bar
    from tensorwire.bench.stream import bench_stream, stream_targets
    from tensorwire.bench.tables import print_table, write_rows
    from tensorwire.transports.registry import get_transport

    names = transports_option(transports)
    contenders = len(names) + 1 + any(get_transport(n).baseline == "ucxx_raw" for n in names)
    with benchmark_hubs(), progress_bar() as bar:
        task = bar.add_task("stream trials", total=repeat * contenders)
        rows = bench_stream(
            names,
            records=records,
            columns=columns,
            batches=batches,
            streams=streams,
            window=window,
            repeat=repeat,
            ucxx_baseline=any(get_transport(n).baseline == "ucxx_raw" for n in names),
            progress=lambda: bar.advance(task),
        )
    title = (
        f"{batches} batches of {records} x {columns} int64 ({records * columns * 8:,} bytes), "
        f"{streams} stream(s), median of {repeat}"
    )
    cols = [
        "contender",
        "mb_per_s",
        "batches_per_s",
        "mean_us",
        "p50_us",
        "p95_us",
        "p99_us",
        "max_us",
        "send_cpu_us",
        "recv_cpu_us",
        "vs_flight",
        "complete",
    ]
    print_table(rows, title, cols, console)
    for label, met, measured in stream_targets(rows):
        if met is None:
            console.print(f"{label}: [yellow]{measured}[/]")
        else:
            console.print(f"{label}: {measured} " + ("[green]met[/]" if met else "[red]missed[/]"))
    out_dir = results_dir(out, "bench-stream")
    paths = write_rows(rows, out_dir, "stream")
    console.print(f"results: {', '.join(str(p) for p in paths)}")


bench_app.command("collective")(bench_collective_cmd)
bench_app.command("scale")(bench_scale_cmd)
bench_app.command("fl")(bench_fl_cmd)  # after the microbenchmarks, as --help lists them
