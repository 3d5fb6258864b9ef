"""``tensorwire fl scale``: a thousand devices on one machine, per protocol: time per round
and the server's memory (see :mod:`tensorwire.bench.many_devices`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from tensorwire.cli.console import console
from tensorwire.cli.options import split_list


def scale_cmd(
    protocols: Annotated[
        str, typer.Option(help="Comma-separated: tcp, mqtt (a private broker) ...")
    ] = "tcp,mqtt",
    devices: Annotated[int, typer.Option(min=1, help="Devices of the run.")] = 1000,
    fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Fraction of the devices sampled per round.")
    ] = 0.05,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds per run.")] = 10,
    devices_per_process: Annotated[
        int, typer.Option(min=1, help="Devices a device process holds, a thread each.")
    ] = 250,
    model: Annotated[str, typer.Option(help="A built-in model (mlp: 49,338 parameters).")] = "mlp",
    seed: Annotated[int, typer.Option(help="Seed of the model, data, sampling, training.")] = 0,
    join_timeout: Annotated[
        float, typer.Option(help="Seconds for every device to join and be set up.")
    ] = 600.0,
    round_timeout: Annotated[float, typer.Option(help="A round's deadline, seconds.")] = 300.0,
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
) -> None:
    """Run DEVICES devices (synthetic data, FRACTION of them per round) against one server
    per protocol, DEVICES_PER_PROCESS to a process; print time per round and server memory."""
    from tensorwire.bench.many_devices import COLUMNS, run_many
    from tensorwire.bench.tables import print_table
    from tensorwire.fl.config import FLConfig

    out = out or Path("results") / f"fl-scale-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        cfg = FLConfig(
            dataset="synthetic",
            model=model,
            clients=devices,
            rounds=rounds,
            fraction=fraction,
            seed=seed,
            join_timeout=join_timeout,
            round_timeout=round_timeout,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    rows = []
    for protocol in split_list(protocols):
        console.print(f"{protocol}: {devices} devices, {devices_per_process} per process ...")
        rows.append(run_many(cfg, protocol, out / protocol, devices_per_process))
        out.mkdir(parents=True, exist_ok=True)
        (out / "scale.json").write_text(json.dumps(rows, indent=2))
    print_table(
        rows, f"FL with {devices} devices on one machine (wall seconds; MiB)", COLUMNS, console
    )
    console.print(f"results: {out}")
