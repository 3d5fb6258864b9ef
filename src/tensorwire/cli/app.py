"""The ``tensorwire`` command line (typer + rich).

Errors a command meets at run time are one line on standard error (``tensorwire --debug``
shows the traceback); the library's log lines (``cannot reach URL (...), retrying (n)``)
go to standard error as they happen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

import tensorwire
from tensorwire._lifeline import watch_parent
from tensorwire.cli.console import console, err_console
from tensorwire.cli.fl import fl_app
from tensorwire.errors import TensorwireError, UnknownScheme
from tensorwire.transports.base import OPEN_DOOR
from tensorwire.transports.registry import get_transport
from tensorwire.transports.registry import listed_transports as registered_transports

if TYPE_CHECKING:
    from tensorwire.bench.fl_matrix import Matrix

app = typer.Typer(
    help="Move tensors fast over the protocols you deploy, and measure which one wins.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
bench_app = typer.Typer(
    help="Benchmarks that compare with a baseline in the same run.", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")
app.add_typer(fl_app, name="fl")


def _version(value: bool) -> None:
    if value:
        console.print(f"tensorwire {tensorwire.__version__}")
        raise typer.Exit()


DEBUG_ENV = "TENSORWIRE_DEBUG"
CONFIRM_ABOVE_S = 15 * 60  # a bench fl run estimated longer asks before it starts
_debug = False  # set by --debug (or TENSORWIRE_DEBUG=1): errors show their traceback


def _show_logs(level: int) -> None:
    """Send tensorwire's log lines at ``level`` and above to standard error, once."""
    from rich.logging import RichHandler

    logger = logging.getLogger("tensorwire")
    logger.setLevel(level)
    if not any(getattr(h, "_tensorwire_cli", False) for h in logger.handlers):
        handler = RichHandler(
            console=err_console, show_path=False, markup=False, rich_tracebacks=False
        )
        handler._tensorwire_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.propagate = False  # a root handler (logging.basicConfig) would print them twice


class _LoopbackHubChatter(logging.Filter):
    """Drops the transports' lines below WARNING (joins and leaves, chiefly) and their
    open-door warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("tensorwire.transports"):
            return True
        return record.levelno >= logging.WARNING and not getattr(record, OPEN_DOOR, False)


@contextlib.contextmanager
def _benchmark_hubs(say: bool = True) -> Iterator[None]:
    """While a benchmark serves its own peers from hubs on 127.0.0.1: one line says so (if
    ``say``: once per command), and each hub's "accepts ANYONE" warning and the transports'
    INFO lines (joins, leaves) are not printed (--debug prints them). Warnings and errors of
    any other kind still are."""
    if _debug:
        yield
        return
    if say:
        err_console.print(
            "[dim]bench: its hubs listen on 127.0.0.1 for its own peers only, with no "
            "credentials; their INFO lines (joins, leaves) are not shown (--debug shows them)[/]"
        )
    chatter = _LoopbackHubChatter()
    handlers = [
        h for h in logging.getLogger("tensorwire").handlers if getattr(h, "_tensorwire_cli", False)
    ]
    for h in handlers:
        h.addFilter(chatter)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(chatter)


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar=DEBUG_ENV,
            help="On an error, show the whole traceback (not one line); log DEBUG lines too.",
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="Log warnings and errors only (not progress).")
    ] = False,
) -> None:
    """tensorwire: tensors over TCP, UDP, ZeroMQ, MQTT, AMQP, Arrow Flight and shared memory."""
    global _debug
    _debug = debug
    _show_logs(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)


def _out_dir(out: Path | None, name: str) -> Path:
    return out or Path("results") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a shape like 1000x1000") from None


def _transport_names() -> list[str]:
    """Every registered transport's name (``zmq`` for zmq+tcp)."""
    return [entry.name for entry in registered_transports()]


def _transports_option(text: str) -> list[str]:
    """``--transports``: 'all', or names / schemes of registered transports."""
    if text == "all":
        return _transport_names()
    try:
        return [get_transport(t).name for t in _split(text)]
    except UnknownScheme as exc:
        raise typer.BadParameter(str(exc)) from None


def _protocols_help() -> str:
    """``bench fl --protocols``'s help, from the registry: what runs across the testbed's
    links, and what 'all' holds that is skipped (same-host transports)."""
    across = [p for e in registered_transports() if not e.same_host_only for p in e.protocols]
    skipped = [e.name for e in registered_transports() if e.same_host_only]
    also = (
        f"; {', '.join(skipped)} {'is' if len(skipped) == 1 else 'are'} skipped" if skipped else ""
    )
    return (
        f"Comma-separated: {' '.join(across)}, or 'all' (every registered transport{also}). "
        "Default: all."
    )


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def split_profiles(text: str) -> tuple[str, ...]:
    """``--profiles``: comma-separated like every list; a custom profile's ``key=value``
    settings stay with it (``3g,20mbit,delay=30ms`` is ``3g`` and ``20mbit,delay=30ms``).
    The ``;`` separator of tensorwire 0.1 still works, with a note that it is deprecated."""
    if ";" in text:
        err_console.print(
            "note: ';' between --profiles is deprecated; separate them with ',' like every "
            "other list (a profile's key=value settings stay with it)"
        )
        return tuple(p.strip() for p in text.split(";") if p.strip())
    profiles: list[list[str]] = []
    for token in _split(text):
        if "=" in token and profiles:
            profiles[-1].append(token)
        else:
            profiles.append([token])
    return tuple(",".join(p) for p in profiles)


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

    chosen = _transports_option(transports)
    if baselines == "auto":
        base = wrapped_libraries(chosen)
    else:
        from tensorwire.bench.baselines import resolve

        try:
            base = [resolve(name) for name in _split(baselines)]
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--baselines") from None
    with _benchmark_hubs():
        rows = bench_transfer(
            transports=chosen,
            baseline_modules=base,
            dtypes=_split(dtypes),
            shapes=[_shape(s) for s in _split(shapes)],
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
    out_dir = _out_dir(out, "bench-transfer")
    paths = write_rows(rows, out_dir, "transfer") + transfer_figure(rows, out_dir)
    if rss_gib > 0:
        with _benchmark_hubs(say=False):  # said before the table
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
    """Small-message ping-pong: raw socket, tensorwire tcp, pyzmq, tensorwire zmq+tcp."""
    from tensorwire.bench.latency import bench_latency, latency_targets
    from tensorwire.bench.tables import print_table, write_rows

    try:
        sizes = [int(p) for p in _split(payloads)]
    except ValueError:
        raise typer.BadParameter(
            f"{payloads!r} is not a list of byte counts like 4096,40960"
        ) from None
    with _benchmark_hubs():
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
    out_dir = _out_dir(out, "bench-latency")
    paths = write_rows(rows, out_dir, "latency")
    console.print(f"results: {', '.join(str(p) for p in paths)}")


@bench_app.command("codec")
def bench_codec_cmd(
    repeat: Annotated[int, typer.Option(min=1, help="Timed runs per case (median reported).")] = 5,
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
) -> None:
    """tensorwire codecs vs lz4 / zstd / blosc2 called directly (the Dask case), and auto."""
    from tensorwire.bench.codec import bench_auto_incompressible, bench_codecs
    from tensorwire.bench.tables import print_table, write_rows

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
    print_table(rows, f"np.ones((4096, 4096)) float64, 128 MiB, median of {repeat}", cols, console)
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
    out_dir = _out_dir(out, "bench-codec")
    paths = write_rows(rows, out_dir, "codec") + write_rows([auto], out_dir, "auto")
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

    names = _transports_option(transports)
    contenders = len(names) + 1
    with _benchmark_hubs(), progress_bar() as bar:
        task = bar.add_task("stream trials", total=repeat * contenders)
        rows = bench_stream(
            names,
            records=records,
            columns=columns,
            batches=batches,
            streams=streams,
            window=window,
            repeat=repeat,
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
    out_dir = _out_dir(out, "bench-stream")
    paths = write_rows(rows, out_dir, "stream")
    console.print(f"results: {', '.join(str(p) for p in paths)}")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in _split(text))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a list of numbers like 0,0.05,0.1") from None


@bench_app.command("fl")
def bench_fl_cmd(
    quick: Annotated[
        bool,
        typer.Option(
            help="digits, VGG-5, 4 devices, 3 rounds, every protocol, 4g (other options "
            "given still apply)."
        ),
    ] = False,
    protocols: Annotated[
        str | None,
        typer.Option(help=_protocols_help()),
    ] = None,
    models: Annotated[
        str | None,
        typer.Option(help="Comma-separated: vgg5, vgg8, resnet18. Default: vgg5,vgg8."),
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated sizes of synthetic updates, e.g. 1MB,10MB,100MB: "
            "communication without training (a payload:<size> model each), instead of "
            "--models unless that is given too."
        ),
    ] = None,
    profiles: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated link profiles: 3g, 4g, wifi, lan, none, or custom: a rate "
            "or profile and its key=value settings, e.g. 3g,20mbit,delay=30ms,loss=1% "
            "(two profiles). Default: 3g,4g,wifi."
        ),
    ] = None,
    loss: Annotated[
        str | None,
        typer.Option(help="Comma-separated packet loss fractions, e.g. 0,0.05,0.1. Default: 0."),
    ] = None,
    stress: Annotated[
        str | None,
        typer.Option(help="Comma-separated stress kinds: none, cpu, network. Default: none."),
    ] = None,
    uplink: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated uplink compressors: none, fp16, bf16, int8, qsgd, topk, "
            "randomk, dgc, signsgd. Default: none."
        ),
    ] = None,
    downlink: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated downlink modes: none, fp16, delta (XOR with the previous "
            "global model, zstd; lossless, and small after a sparse uplink). Default: none."
        ),
    ] = None,
    security: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: none, tls (enrolled devices with per-device keys, "
            "encrypted traffic: tensorwire certs per experiment). Default: none."
        ),
    ] = None,
    topology: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: star (a shaped link per device), shared (one shaped access "
            "link in front of the server), shared-broker-near (the same, the broker on the "
            "devices' side of it). Default: star."
        ),
    ] = None,
    links: Annotated[
        list[str] | None,
        typer.Option(
            help="Per-device link profiles, one per device, e.g. 3g,4g,4g,wifi (a semicolon "
            "between custom profiles with commas); give it again for another set, 'uniform' "
            "for none. On a star they replace --profiles. Default: uniform."
        ),
    ] = None,
    faults: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated fault scenarios, each none or events joined by +: "
            "kill[N]@R[-BACK] (SIGKILL N devices in round R, restarted in round BACK), "
            "hang[N]@R[-BACK] (SIGSTOP), flap[N]@R[:Ts] (links down T s), broker@R[:Ts] "
            "(restart the broker), e.g. none,kill@2-4+hang@3,broker@2. Default: none."
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            min=1.0,
            help="Every round's deadline, s. Default: 600 without faults; with faults, three "
            "times a round's transfers at the slowest link plus 30 s.",
        ),
    ] = None,
    quorum: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Updates a round needs to change the model (the run stops when fewer devices "
            "remain). Default: half the devices with faults, 1 without.",
        ),
    ] = None,
    ratio: Annotated[
        float | None, typer.Option(help="Fraction topk / randomk / dgc keep. Default: 0.01.")
    ] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds. Default: 5.")] = None,
    epochs: Annotated[
        int | None, typer.Option(min=1, help="Local epochs per round. Default: 1.")
    ] = None,
    clients: Annotated[int | None, typer.Option(min=1, help="Devices. Default: 4.")] = None,
    dataset: Annotated[
        str | None, typer.Option(help="digits, cifar10, synthetic. Default: digits.")
    ] = None,
    reps: Annotated[int | None, typer.Option(min=1, help="Repetitions. Default: 1.")] = None,
    network_mbit: Annotated[
        float | None,
        typer.Option(help="Load the network stressor offers per device, Mbit/s. Default: 250."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run directory (done experiments skipped).")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Go on with the run in this directory, with the matrix it recorded."),
    ] = None,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes",
            "-y",
            help="Start a long run without asking (a run over "
            f"{CONFIRM_ABOVE_S // 60} minutes asks first on a terminal, and without one "
            "needs --yes).",
        ),
    ] = False,
) -> None:
    """FedAvg over every protocol on the emulated testbed (FedComm): table, figures, report.

    Needs root (network namespaces shape each device's link); without, it runs unshaped on
    loopback and labels every output so. Prints the matrix's size and estimated time first.
    """
    import json

    from tensorwire.bench.fl import run_matrix
    from tensorwire.bench.fl_matrix import (
        Matrix,
        parse_links,
        protocol_name,
        registered_protocols,
    )

    if resume is not None:
        try:
            recorded = json.loads((resume / "manifest.json").read_text())["matrix"]
        except (OSError, KeyError, ValueError) as exc:
            raise typer.BadParameter(f"{resume} holds no bench fl run to resume: {exc}") from None
        matrix, out = Matrix.from_config(recorded), resume
    else:
        given = {
            "protocols": None
            if protocols in (None, "all")
            else tuple(protocol_name(p) for p in _split(protocols)),
            "models": _models_and_payloads(models, payload),
            "profiles": split_profiles(profiles) if profiles else None,
            "losses": _floats(loss) if loss else None,
            "stresses": tuple(_split(stress)) if stress else None,
            "uplinks": tuple(_split(uplink)) if uplink else None,
            "downlinks": tuple(_split(downlink)) if downlink else None,
            "securities": tuple(_split(security)) if security else None,
            "topologies": tuple(_split(topology)) if topology else None,
            "links": tuple(parse_links(each) for each in links) if links else None,
            "faults": tuple(_split(faults)) if faults else None,
            "deadline": deadline,
            "quorum": quorum,
            "ratio": ratio,
            "rounds": rounds,
            "epochs": epochs,
            "clients": clients,
            "dataset": dataset,
            "reps": reps,
            "network_mbit": network_mbit,
        }
        full = {
            "protocols": tuple(registered_protocols()),
            "models": ("vgg5", "vgg8"),
            "profiles": ("3g", "4g", "wifi"),
            "rounds": 5,
        }
        base = Matrix.quick().to_config() if quick else {**Matrix.quick().to_config(), **full}
        _check_fl_choices(given)
        try:
            matrix = Matrix.from_config(
                {**base, **{k: v for k, v in given.items() if v is not None}}
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        out = _out_dir(out, "bench-fl")
    _announce(matrix, ask=not quick and resume is None and not yes)
    started = time.monotonic()
    try:
        summary = run_matrix(matrix, out, say=console.print)
    except KeyboardInterrupt:
        console.print(f"interrupted; go on with: tensorwire bench fl --resume {out}")
        raise typer.Exit(130) from None
    _print_fl_table(out)
    for key, why in summary.failed.items():
        console.print(f"[red]failed[/] {key}: {why.splitlines()[0]}")
    console.print(
        f"{len(summary.ran)} experiment(s) run, {len(summary.resumed)} done before, "
        f"{len(summary.skipped)} skipped, {len(summary.failed)} failed; "
        f"{summary.label}; wall time {time.monotonic() - started:.0f} s"
    )
    console.print(f"report: {summary.report}")


_EXPERIMENT_S = 40.0  # per experiment: testbed, broker, processes, the first round's warm-up
_ROUND_S = 3.0  # per round: evaluation, aggregation, counters
# Training seconds per sample and CPU core, measured on this project's 2-core machine.
_TRAIN_S_PER_SAMPLE = {"vgg5": 0.005, "vgg8": 0.024, "resnet18": 0.035}
_TRAIN_SAMPLES = {"digits": 1437, "synthetic": 400, "cifar10": 50000}
_MODEL_BYTES = {"vgg5": 582_346 * 4, "vgg8": 1_337_898 * 4, "resnet18": 44_734_408}


def _models_and_payloads(models: str | None, payload: str | None) -> tuple[str, ...] | None:
    """``--models`` and ``--payload`` as one models axis: each payload size as a
    ``payload:<size>`` model (``10MB`` -> ``payload:10MB``)."""
    named = _split(models) if models else []
    sizes = [f"payload:{size}" for size in _split(payload)] if payload else []
    return tuple(named + sizes) or None


def _check_fl_choices(given: dict) -> None:
    """Models and datasets the FL runtime has, checked before anything starts."""
    from tensorwire.fl.config import BUILTIN_MODELS, is_builtin_model
    from tensorwire.fl.data import DATASETS

    for model in given["models"] or ():
        try:
            known = is_builtin_model(model.lower() if ":" not in model else model)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--payload") from None
        if not known:
            hint = "--payload" if model.startswith("payload:") else "--models"
            raise typer.BadParameter(
                f"no model {model!r}; choose among {', '.join(BUILTIN_MODELS)}, or give "
                "--payload sizes such as 1MB,10MB",
                param_hint=hint,
            )
    if given["dataset"] is not None and given["dataset"] not in DATASETS:
        raise typer.BadParameter(
            f"no dataset {given['dataset']!r}; choose among {', '.join(DATASETS)}",
            param_hint="--dataset",
        )


def estimate_seconds(matrix: Matrix, cores: int | None = None) -> float:
    """A rough wall time for the experiments of ``matrix``: training from the dataset's size
    and the model, transfers from the model's bytes and the profile's rate, plus a fixed cost
    per round and per experiment; loss and stress lengthen them. An estimate, to decide
    whether to start, not a measurement."""
    from tensorwire.fl.config import payload_bytes

    cores = cores or len(os.sched_getaffinity(0))
    total = 0.0
    for exp in matrix.experiments():
        model = exp.model.lower()
        payload = payload_bytes(exp.model)
        per_sample = _TRAIN_S_PER_SAMPLE.get(model, max(_TRAIN_S_PER_SAMPLE.values()))
        samples = _TRAIN_SAMPLES.get(exp.dataset, 50000) / exp.clients
        train = exp.epochs * samples * per_sample * max(1.0, exp.clients / cores)
        train = 0.0 if payload is not None else train  # a payload does not train
        rate = exp.link_profile().rate or 1e9  # per-device links: the slowest one's
        size = payload if payload is not None else _MODEL_BYTES.get(model)
        comm = 2 * (size or max(_MODEL_BYTES.values())) * 8 / rate
        comm *= 1 + 10 * exp.loss
        if exp.stress == "cpu":
            train *= 2
        elif exp.stress == "network":
            comm *= 1.5
        total += _EXPERIMENT_S + exp.rounds * (train + comm + _ROUND_S)
        total += _fault_seconds(exp)
    return total


def _fault_seconds(exp: Any) -> float:
    """What an experiment's faults add: a round that waits out its deadline for each hung
    device or flapped link, a broker's restart."""
    from tensorwire.bench.fl import round_deadline
    from tensorwire.bench.fl_faults import parse_scenario

    added = 0.0
    for event in parse_scenario(exp.faults, exp.clients, exp.rounds):
        if event.kind in ("hang", "flap"):
            added += round_deadline(exp)
        elif event.kind == "broker":
            added += 15.0
    return added


def _duration(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _announce(matrix: Matrix, ask: bool) -> None:
    """Say what a bench fl run holds, what it needs and about how long it takes; for a long
    one, ask (on a terminal) or stop unless --yes was given."""
    from tensorwire.bench.fl import protocol_problem
    from tensorwire.testbed import probe_capabilities

    experiments = matrix.experiments()
    problems = {p: protocol_problem(p) for p in matrix.protocols}
    runnable = [e for e in experiments if problems[e.protocol] is None]
    left_out = sorted(p for p, why in problems.items() if why)
    kept = tuple(p for p in matrix.protocols if problems[p] is None)
    seconds = estimate_seconds(dataclasses.replace(matrix, protocols=kept)) if kept else 0.0
    caps = probe_capabilities()
    if caps.mode is None:
        why = "; ".join(caps[n].reason for n in ("root", "userns", "netns") if n in caps.items)
        where = (
            f"it needs root for network namespaces, and has none here ({why}): "
            "an unshaped loopback run"
        )
    else:
        where = f"network namespaces ({caps.mode}) shape each device's link"
    skipped = len(experiments) - len(runnable)
    console.print(
        f"bench fl: {len(experiments)} experiment(s), {matrix.rounds} round(s) each"
        + (f", {skipped} left out ({', '.join(left_out)})" if left_out else "")
        + f"; about {_duration(seconds)} here (a rough estimate); {where}."
    )
    if not ask or seconds <= CONFIRM_ABOVE_S:
        return
    if sys.stdin.isatty():
        typer.confirm("Start it?", abort=True)
        return
    err_console.print(
        f"error: this run would take about {_duration(seconds)}: add --yes to start it, "
        "or narrow it (--protocols, --models, --profiles, --rounds; --quick is the short one)"
    )
    raise typer.Exit(1)


def _print_fl_table(run_dir: Path) -> None:
    """The comparison table of a bench fl run, one row per setting."""
    import json

    import pandas as pd

    from tensorwire.bench.fl_results import DIMENSIONS, TABLE
    from tensorwire.bench.report import key_numbers, varying
    from tensorwire.bench.tables import print_table

    frame = pd.read_parquet(run_dir / TABLE) if (run_dir / TABLE).is_file() else pd.DataFrame()
    if frame.empty:
        console.print("no experiment completed")
        return
    by = varying(frame, DIMENSIONS)
    table = key_numbers(frame, by)
    names = {
        "comm_s": "comm s/round",
        "lower_bound_s": "bound s/round",
        "ratio": "comm/bound",
        "payload_MB": "MB/round",
        "wire_MB": "link MB/round",
        "retrans_segs": "TCP retrans/round",
        "final_accuracy_pct": "final acc %",
    }
    rows = [
        {str(k): v for k, v in r.items()} for r in table.rename(columns=names).to_dict("records")
    ]
    labels = list(dict.fromkeys(frame["label"]))
    if len(labels) > 1:  # one per profile: the run's own label says it shorter
        labels = [json.loads((run_dir / "manifest.json").read_text()).get("label", "")]
    print_table(rows, f"FedAvg communication ({labels[0]})", [*by, *names.values()], console)


@app.command("report")
def report_cmd(
    runs: Annotated[list[Path], typer.Argument(help="Run directories of `bench fl`.")],
    out: Annotated[
        Path | None, typer.Option(help="Where a comparison of several runs goes.")
    ] = None,
) -> None:
    """Rebuild a run's figures and report.html, or compare several runs in one report."""
    from tensorwire.bench.report import build_report

    for run in runs:
        if not run.is_dir():
            raise typer.BadParameter(f"{run} is not a directory")
    if len(runs) > 1 and out is None:
        out = _out_dir(None, "compare-fl")
    try:
        path = build_report(runs, out)
    except FileNotFoundError as exc:
        raise typer.BadParameter(str(exc)) from None
    console.print(f"report: {path}")


@app.command("certs")
def certs_cmd(
    out: Annotated[Path, typer.Option(help="Directory to write the files into.")] = Path("certs"),
    hosts: Annotated[
        str, typer.Option(help="Comma-separated names and addresses the hub is reached by.")
    ] = "127.0.0.1,localhost",
    clients: Annotated[
        str, typer.Option(help="Comma-separated client ids to enrol, e.g. device-1,device-2.")
    ] = "device-1,device-2,device-3,device-4",
) -> None:
    """Make a CA, the hub's certificate, and a certificate + secret per device.

    Reuses the CA already in OUT, so devices can be enrolled later. The hub loads
    OUT/keys.json (--auth) and hub.pem/hub.key/ca.pem (--tls-*); each device takes its own
    <id>.pem, <id>.key, <id>.secret and ca.pem.
    """
    from tensorwire.transports.certs import make_certs

    try:
        made = make_certs(out, hosts=_split(hosts), clients=_split(clients))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    console.print(f"CA: {made.ca}\nhub: {made.hub_cert}, {made.hub_key}\nkeys: {made.keys}")
    for cid, files in made.devices.items():
        console.print(f"{cid}: " + ", ".join(str(f) for f in files.values()))


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] + (" ..." if len(lines) > 1 else "") if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def main() -> None:
    """The ``tensorwire`` command: an error is one line (the traceback with --debug)."""
    watch_parent()  # started by a testbed: end with the process that started us
    try:
        app()
    except Exception as exc:
        if _debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        hint = "" if isinstance(exc, TensorwireError | OSError) else " (a bug? please report it)"
        err_console.print(
            f"[red]error:[/] {escape(_one_line(exc))}{hint}  [dim](tensorwire --debug ... "
            "shows the traceback)[/]",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)
