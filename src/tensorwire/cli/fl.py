"""``tensorwire fl``: the FL server, a device, or a whole local run.

Every default comes from :class:`~tensorwire.fl.config.FLConfig` (read without importing
torch), so the commands, the library and ``bench fl`` cannot drift apart.
"""

from __future__ import annotations

import logging
import time
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import click
import typer

from tensorwire.cli.console import console
from tensorwire.cli.fl_options import (
    Alpha,
    Batch,
    Certs,
    Clients,
    ClipNorm,
    D,
    DataRoot,
    Dataset,
    Downlink,
    Epochs,
    ErrorFeedback,
    Fraction,
    JoinTimeout,
    Late,
    LosslessCodec,
    Lr,
    MaxSamples,
    MinUpdates,
    Model,
    Momentum,
    Mu,
    Out,
    PerRound,
    Ratio,
    Rounds,
    RoundTimeout,
    Seed,
    ServerLr,
    Split,
    Strategy,
    Trim,
    Uplink,
    _check_model,
)
from tensorwire.cli.fl_scale import scale_cmd
from tensorwire.cli.interrupts import interrupted_run, resumed_run
from tensorwire.cli.options import protocol_option
from tensorwire.cli.progress_file import ProgressFile
from tensorwire.fl.config import (
    FLConfig,
)

fl_app = typer.Typer(
    help="Federated learning over any tensorwire URL: rounds that survive devices, validated "
    "updates, FedAvg / FedProx / FedAdam / FedYogi / median / trimmed mean, resume.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
fl_app.command("scale")(scale_cmd)


def _config(options: dict[str, Any], base: dict[str, Any] | None = None) -> FLConfig:
    """The FLConfig a command's options describe (over ``base``: a resumed run's settings)."""
    kwargs = {f.name: options[f.name] for f in fields(FLConfig) if f.name in options}
    if kwargs.get("data_root") is not None:
        kwargs["data_root"] = str(kwargs["data_root"])
    try:
        return FLConfig(**{**(base or {}), **kwargs})
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _given(ctx: typer.Context) -> set[str]:
    """The options given on the command line or by the environment (not the defaults)."""
    sources = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return {name for name in ctx.params if ctx.get_parameter_source(name) in sources}


def _print_rounds(rows: list[dict]) -> None:
    from tensorwire.bench.tables import print_table

    print_table(
        rows,
        "FL rounds",
        [
            "round",
            "status",
            "updates",
            "accuracy",
            "test_loss",
            "train_loss",
            "uplink_bytes",
            "downlink_bytes",
            "comm_s",
            "round_s",
        ],
        console,
    )


def _device_ids(n: int) -> list[str]:
    return [f"device-{i}" for i in range(1, n + 1)]


@fl_app.command("run")
def run_cmd(
    protocol: Annotated[
        str,
        typer.Option(
            help="tcp, or any registered transport (checked before anything starts).",
            callback=protocol_option,
        ),
    ] = "tcp",
    dataset: Dataset = D.dataset,
    data_root: DataRoot = None,
    model: Model = D.model,
    clients: Clients = D.clients,
    rounds: Rounds = D.rounds,
    epochs: Epochs = D.epochs,
    batch_size: Batch = D.batch_size,
    lr: Lr = D.lr,
    momentum: Momentum = D.momentum,
    split: Split = D.split,
    alpha: Alpha = D.alpha,
    seed: Seed = D.seed,
    uplink: Uplink = D.uplink,
    ratio: Ratio = D.ratio,
    error_feedback: ErrorFeedback = D.error_feedback,
    downlink: Downlink = D.downlink,
    codec: LosslessCodec = D.codec,
    fraction: Fraction = D.fraction,
    clients_per_round: PerRound = D.clients_per_round,
    min_updates: MinUpdates = D.min_updates,
    late: Late = D.late,
    strategy: Strategy = D.strategy,
    mu: Mu = D.mu,
    server_lr: ServerLr = D.server_lr,
    trim: Trim = D.trim,
    clip_norm: ClipNorm = D.clip_norm,
    join_timeout: JoinTimeout = D.join_timeout,
    round_timeout: RoundTimeout = D.round_timeout,
    out: Out = None,
    secure: Annotated[
        bool,
        typer.Option(
            help="Enrol the devices (tensorwire certs into OUT/certs) and run over TLS with "
            "per-device keys."
        ),
    ] = False,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Go on with the interrupted run whose results directory this is, from its last "
            "checkpoint (its settings, protocol and certificates)."
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="What places the device processes: local (this machine), or ray (the nodes "
            "of a Ray cluster; extra 'ray'). Devices join the server by URL either way."
        ),
    ] = "local",
    devices_per_process: Annotated[
        int, typer.Option(min=1, help="Devices a process holds, a thread each.")
    ] = 1,
    url: Annotated[
        str | None,
        typer.Option(
            help="Serve here (an address every node reaches, e.g. tcp://10.0.0.1:0) instead "
            "of a local URL of --protocol."
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="The Ray cluster (HOST:PORT of its head); else $RAY_ADDRESS or one here."
        ),
    ] = None,
    ray_nodes: Annotated[
        int, typer.Option(min=1, help="Wait (--join-timeout s) for this many alive Ray nodes.")
    ] = 1,
    max_restarts: Annotated[
        int, typer.Option(min=0, help="Times Ray restarts a device process that died.")
    ] = 3,
) -> None:
    """Run a server here and the devices as processes placed by an engine, with a progress
    bar."""
    from tensorwire.bench.progress import progress_bar
    from tensorwire.fl.engines import ENGINES, make_engine
    from tensorwire.fl.run import run_local

    if engine not in ENGINES:
        raise typer.BadParameter(f"{engine!r}: choose {', '.join(ENGINES)}", param_hint="--engine")
    if resume is not None:
        cfg, protocol, certs = resumed_run(resume)
        out = resume
    else:
        cfg = _config(locals())
        out = out or Path("results") / f"fl-{protocol}-{time.strftime('%Y%m%d-%H%M%S')}"
        certs = None
    if secure and certs is None:
        from tensorwire.transports.certs import make_certs

        certs = out / "certs"
        make_certs(certs, hosts=["127.0.0.1", "localhost"], clients=_device_ids(cfg.clients))
    placer = make_engine(
        engine,
        cfg,
        devices_per_process=devices_per_process,
        log_dir=out / "logs",
        certs=certs,
        ray_address=ray_address,
        ray_nodes=ray_nodes,
        max_restarts=max_restarts,
    )
    done = [0]

    def on_round(row: dict[str, Any]) -> None:
        done[0] = int(row["round"])
        bar.advance(task)

    with progress_bar() as bar, interrupted_run("fl run", out, done, cfg.rounds):
        task = bar.add_task(f"{cfg.strategy} over {protocol}", total=cfg.rounds)
        result, path = run_local(
            cfg,
            protocol,
            out_dir=out,
            on_round=on_round,
            certs=certs,
            resume=resume,
            engine=placer,
            url=url,
        )
    _print_rounds(result.rounds)
    console.print(f"results: {path}")


@fl_app.command("server")
def server_cmd(
    ctx: typer.Context,
    url: Annotated[str, typer.Option(help="URL to serve on, e.g. tcp://0.0.0.0:5555.")],
    dataset: Dataset = D.dataset,
    data_root: DataRoot = None,
    model: Model = D.model,
    clients: Clients = D.clients,
    rounds: Rounds = D.rounds,
    epochs: Epochs = D.epochs,
    batch_size: Batch = D.batch_size,
    lr: Lr = D.lr,
    momentum: Momentum = D.momentum,
    split: Split = D.split,
    alpha: Alpha = D.alpha,
    seed: Seed = D.seed,
    uplink: Uplink = D.uplink,
    ratio: Ratio = D.ratio,
    error_feedback: ErrorFeedback = D.error_feedback,
    downlink: Downlink = D.downlink,
    codec: LosslessCodec = D.codec,
    fraction: Fraction = D.fraction,
    clients_per_round: PerRound = D.clients_per_round,
    min_updates: MinUpdates = D.min_updates,
    late: Late = D.late,
    strategy: Strategy = D.strategy,
    mu: Mu = D.mu,
    server_lr: ServerLr = D.server_lr,
    trim: Trim = D.trim,
    clip_norm: ClipNorm = D.clip_norm,
    max_samples: MaxSamples = D.max_samples,
    join_timeout: JoinTimeout = D.join_timeout,
    round_timeout: RoundTimeout = D.round_timeout,
    out: Out = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Go on with the run whose results directory this is, from its last checkpoint "
            "(its settings; results go on being written there)."
        ),
    ] = None,
    certs: Certs = None,
    fanout: Annotated[
        str,
        typer.Option(
            help="How the model goes out to the devices: concurrent (to all at once), or "
            "sequential (one device after another, as FedComm's TCP server did)."
        ),
    ] = "concurrent",
    progress: Annotated[Path | None, typer.Option(hidden=True)] = None,
    progress_ack: Annotated[float, typer.Option(hidden=True)] = 0.0,
) -> None:
    """Serve rounds at URL until every one is done; devices join with `tensorwire fl client`."""
    from tensorwire.fl.errors import QuorumLost
    from tensorwire.fl.server import run_server
    from tensorwire.transports import FANOUTS

    if fanout not in FANOUTS:
        raise typer.BadParameter(
            f"{fanout!r}: choose among {', '.join(FANOUTS)}", param_hint="--fanout"
        )
    options = dict(locals())
    if resume is not None:
        from tensorwire.fl.checkpoint import load_checkpoint

        saved = load_checkpoint(resume).config
        cfg = _config({k: v for k, v in options.items() if k in _given(ctx)}, saved)
        out = resume
    else:
        cfg = _config(options)
        out = out or Path("results") / f"fl-server-{time.strftime('%Y%m%d-%H%M%S')}"
    events = ProgressFile(progress, progress_ack, append=resume is not None) if progress else None

    def ready(hub_url: str) -> None:
        console.print(f"serving at {hub_url}")
        if events:
            events.write("ready", url=hub_url)

    done = [0]

    def round_done(row: dict[str, Any]) -> None:
        done[0] = int(row["round"])
        console.print(
            f"round {row['round']}: {row['status']}, {row['updates']} update(s), "
            f"accuracy {row['accuracy']:.3f}"
        )
        if events:
            events.round(row)

    try:
        with interrupted_run("fl server", out, done, cfg.rounds, again=f"--url {url}"):
            result = run_server(
                url,
                cfg,
                on_ready=ready,
                on_round=round_done,
                certs=certs,
                out_dir=out,
                resume=resume,
                hub_options={"fanout": fanout} if fanout != "concurrent" else None,
            )
    except QuorumLost as exc:
        if events:
            events.write("stopped", reason=str(exc), out=str(out))
        raise
    _print_rounds(result.rounds)
    console.print(f"results: {out}")
    if events:
        events.write("done", out=str(out))


@fl_app.command("client")
def client_cmd(
    url: Annotated[str, typer.Option(help="The server's URL.")],
    id: Annotated[str, typer.Option("--id", help="This device's number or name.")],
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds to go on trying to reach the server (it may not be up yet), and to "
            "reconnect after losing it. A host name that does not resolve fails at once."
        ),
    ] = 120.0,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads.")] = 1,
    model: Annotated[
        str | None,
        typer.Option(
            callback=_check_model,
            help="package.module:function building this device's model, when the server "
            "trains one of its own (the built-in ones need nothing).",
        ),
    ] = None,
    certs: Certs = None,
    count: Annotated[
        int,
        typer.Option(
            min=1, help="Devices this process holds, a thread each: ID, ID+1 ... (ID a number)."
        ),
    ] = 1,
) -> None:
    """Join the server at URL as device ID (or COUNT devices from ID) and train until it says
    done."""
    from tensorwire.fl.client import run_client
    from tensorwire.fl.engines import device_ids, run_devices
    from tensorwire.fl.task import model_factory

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if count == 1:  # one device: its error is this command's
        client_id = f"device-{id}" if id.isdigit() else id
        factory = model_factory(model) if model is not None else None
        rounds = run_client(
            url, client_id, model=factory, timeout=timeout, threads=threads, certs=certs
        )
        console.print(f"{client_id}: trained {rounds} rounds")
        return
    if not id.isdigit():
        raise typer.BadParameter("--count needs a numeric --id (the first device)")
    results = run_devices(
        url, device_ids(int(id), count), timeout=timeout, threads=threads, certs=certs, model=model
    )
    for cid, r in results.items():
        console.print(
            f"{cid}: " + (f"failed: {r}" if isinstance(r, str) else f"trained {r} rounds")
        )
    if any(isinstance(r, str) for r in results.values()):
        raise typer.Exit(1)
