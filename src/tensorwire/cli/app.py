"""The ``tensorwire`` command line (typer + rich).

Errors a command meets at run time are one line on standard error (``tensorwire --debug``
shows the traceback); the library's log lines (``cannot reach URL (...), retrying (n)``)
go to standard error as they happen.

The root app and its own commands (report, certs) are here; each command group has its
module: :mod:`.bench`, :mod:`.bench_fl`, :mod:`.fl`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

import tensorwire
from tensorwire._lifeline import watch_parent
from tensorwire.cli.arrow_pool import prefer_system_pool
from tensorwire.cli.bench import bench_app
from tensorwire.cli.console import console, err_console
from tensorwire.cli.fl import fl_app
from tensorwire.cli.fl_estimate import CONFIRM_ABOVE_S, estimate_seconds
from tensorwire.cli.logs import debugging, set_debug
from tensorwire.cli.options import results_dir, split_list, split_profiles
from tensorwire.errors import TensorwireError

app = typer.Typer(
    help="Move tensors fast over the protocols you deploy, and measure which one wins.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
)
app.add_typer(bench_app, name="bench")
app.add_typer(fl_app, name="fl")

__all__ = ["CONFIRM_ABOVE_S", "app", "estimate_seconds", "main", "split_profiles"]


def _version(value: bool) -> None:
    if value:
        console.print(f"tensorwire {tensorwire.__version__}")
        raise typer.Exit()


DEBUG_ENV = "TENSORWIRE_DEBUG"


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
    set_debug(debug, quiet)


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
        out = results_dir(None, "compare-fl")
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
        made = make_certs(out, hosts=split_list(hosts), clients=split_list(clients))
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
    prefer_system_pool()  # before pyarrow is imported: half a flight hub's memory per client
    try:
        app()
    except Exception as exc:
        if debugging() or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        hint = "" if isinstance(exc, TensorwireError | OSError) else " (a bug? please report it)"
        err_console.print(
            f"[red]error:[/] {escape(_one_line(exc))}{hint}  [dim](tensorwire --debug ... "
            "shows the traceback)[/]",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)
