"""``tensorwire fl``: the FedAvg server, a device, or a whole local run."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from tensorwire.cli.console import console

fl_app = typer.Typer(
    help="Federated learning (FedAvg) over any tensorwire URL.", no_args_is_help=True
)

Dataset = Annotated[str, typer.Option(help="digits (offline default), cifar10, synthetic.")]
DataRoot = Annotated[Path | None, typer.Option(help="Folder holding CIFAR-10 (never downloaded).")]
Model = Annotated[str, typer.Option(help="vgg5 or vgg8.")]
Clients = Annotated[int, typer.Option(min=1, help="Number of devices.")]
Rounds = Annotated[int, typer.Option(min=1, help="Number of rounds.")]
Epochs = Annotated[int, typer.Option(min=1, help="Local epochs per round.")]
Batch = Annotated[int, typer.Option(min=1, help="Local batch size.")]
Lr = Annotated[float, typer.Option(help="SGD learning rate.")]
Momentum = Annotated[float, typer.Option(help="SGD momentum.")]
Split = Annotated[str, typer.Option(help="equal (contiguous shards), iid, dirichlet.")]
Alpha = Annotated[float, typer.Option(help="Dirichlet concentration for --split dirichlet.")]
Seed = Annotated[int, typer.Option(help="Seed for the model, data split and shuffles.")]
Uplink = Annotated[
    str, typer.Option(help="Update compressor: none fp16 bf16 int8 qsgd topk randomk dgc signsgd.")
]
Ratio = Annotated[float, typer.Option(help="Fraction kept by topk / randomk / dgc.")]
ErrorFeedback = Annotated[
    bool, typer.Option(help="Carry what compression dropped to the next round.")
]
Downlink = Annotated[str, typer.Option(help="Global model: none, fp16, delta.")]
Out = Annotated[Path | None, typer.Option(help="Results directory.")]


def _config(**kwargs):
    from tensorwire.fl.config import FLConfig

    if kwargs.get("data_root") is not None:
        kwargs["data_root"] = str(kwargs["data_root"])
    try:
        return FLConfig(**kwargs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _print_rounds(rows: list[dict]) -> None:
    from tensorwire.bench.tables import print_table

    print_table(
        rows,
        "FedAvg rounds",
        [
            "round",
            "accuracy",
            "test_loss",
            "train_loss",
            "uplink_bytes",
            "downlink_bytes",
            "comm_s",
            "train_s_max",
        ],
        console,
    )


@fl_app.command("run")
def run_cmd(
    protocol: Annotated[str, typer.Option(help="tcp, or any registered transport.")] = "tcp",
    dataset: Dataset = "digits",
    data_root: DataRoot = None,
    model: Model = "vgg8",
    clients: Clients = 4,
    rounds: Rounds = 5,
    epochs: Epochs = 1,
    batch_size: Batch = 100,
    lr: Lr = 0.01,
    momentum: Momentum = 0.9,
    split: Split = "equal",
    alpha: Alpha = 0.5,
    seed: Seed = 0,
    uplink: Uplink = "none",
    ratio: Ratio = 0.01,
    error_feedback: ErrorFeedback = True,
    downlink: Downlink = "none",
    out: Out = None,
) -> None:
    """Run a server here and the devices as local processes, with a progress bar."""
    from tensorwire.bench.progress import progress_bar
    from tensorwire.fl.run import run_local

    cfg = _config(
        dataset=dataset,
        data_root=data_root,
        model=model,
        clients=clients,
        rounds=rounds,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        momentum=momentum,
        split=split,
        alpha=alpha,
        seed=seed,
        uplink=uplink,
        ratio=ratio,
        error_feedback=error_feedback,
        downlink=downlink,
    )
    out = out or Path("results") / f"fl-{protocol}-{time.strftime('%Y%m%d-%H%M%S')}"
    with progress_bar() as bar:
        task = bar.add_task(f"FedAvg over {protocol}", total=cfg.rounds)
        result, path = run_local(cfg, protocol, out_dir=out, on_round=lambda row: bar.advance(task))
    _print_rounds(result.rounds)
    console.print(f"results: {path}")


@fl_app.command("server")
def server_cmd(
    url: Annotated[str, typer.Option(help="URL to serve on, e.g. tcp://0.0.0.0:5555.")],
    dataset: Dataset = "digits",
    data_root: DataRoot = None,
    model: Model = "vgg8",
    clients: Clients = 4,
    rounds: Rounds = 5,
    epochs: Epochs = 1,
    batch_size: Batch = 100,
    lr: Lr = 0.01,
    momentum: Momentum = 0.9,
    split: Split = "equal",
    alpha: Alpha = 0.5,
    seed: Seed = 0,
    uplink: Uplink = "none",
    ratio: Ratio = 0.01,
    error_feedback: ErrorFeedback = True,
    downlink: Downlink = "none",
    out: Out = None,
) -> None:
    """Serve FedAvg at URL until every round is done; devices join with `tensorwire fl client`."""
    from tensorwire.fl.results import write_run
    from tensorwire.fl.server import run_server

    cfg = _config(
        dataset=dataset,
        data_root=data_root,
        model=model,
        clients=clients,
        rounds=rounds,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        momentum=momentum,
        split=split,
        alpha=alpha,
        seed=seed,
        uplink=uplink,
        ratio=ratio,
        error_feedback=error_feedback,
        downlink=downlink,
    )
    result = run_server(
        url,
        cfg,
        on_ready=lambda u: console.print(f"serving at {u}"),
        on_round=lambda row: console.print(f"round {row['round']}: accuracy {row['accuracy']:.3f}"),
    )
    _print_rounds(result.rounds)
    out = out or Path("results") / f"fl-server-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(f"results: {write_run(result, out, {'url': url})}")


@fl_app.command("client")
def client_cmd(
    url: Annotated[str, typer.Option(help="The server's URL.")],
    id: Annotated[str, typer.Option("--id", help="This device's number or name.")],
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the server each round.")
    ] = 600.0,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads.")] = 1,
) -> None:
    """Join the server at URL as device ID and train until it says done."""
    from tensorwire.fl.client import run_client

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    client_id = f"device-{id}" if id.isdigit() else id
    rounds = run_client(url, client_id, timeout=timeout, threads=threads)
    console.print(f"{client_id}: trained {rounds} rounds")
