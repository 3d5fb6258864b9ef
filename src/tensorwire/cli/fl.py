"""``tensorwire fl``: the FedAvg server, a device, or a whole local run."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated, Any

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
Downlink = Annotated[
    str,
    typer.Option(help="Global model: none, fp16, or delta (XOR with the last, zstd; lossless)."),
]
Out = Annotated[Path | None, typer.Option(help="Results directory.")]
ACK_POLL = 0.002  # seconds between looks at the progress acknowledgement file


class ProgressFile:
    """Events of a server run appended to a file as JSON lines, for a watching process:
    ``ready`` (with the hub's URL), one ``round`` per round (its row), ``done``.

    With ``wait_ack`` > 0, after each round the server waits up to that many seconds until
    ``FILE.ack`` holds the round's number, so the watcher can read counters between rounds."""

    def __init__(self, path: Path, wait_ack: float = 0.0) -> None:
        self.path = path
        self.ack = path.with_name(path.name + ".ack")
        self.wait_ack = wait_ack
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        self.ack.unlink(missing_ok=True)  # an old run's ack would release this one's rounds

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "time": time.time(), **fields}, default=str)
        with self.path.open("a") as f:
            f.write(line + "\n")

    def round(self, row: dict[str, Any]) -> None:
        self.write("round", **row)
        deadline = time.monotonic() + self.wait_ack
        # Polled: the watcher answers through a file, the one channel both sides share.
        while time.monotonic() < deadline and not self._acked(row["round"]):
            time.sleep(ACK_POLL)

    def _acked(self, round_: int) -> bool:
        try:
            return int(self.ack.read_text() or 0) >= round_
        except (OSError, ValueError):
            return False


def _config(options: dict):
    """The FLConfig a command's options describe (its other options are left out)."""
    from dataclasses import fields

    from tensorwire.fl.config import FLConfig

    kwargs = {f.name: options[f.name] for f in fields(FLConfig) if f.name in options}
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


Certs = Annotated[
    Path | None,
    typer.Option(
        help="Directory from `tensorwire certs`: TLS and enrolled per-device keys (the hub "
        "needs hub.pem, hub.key, ca.pem, keys.json; a device ca.pem and its ID.pem, ID.key, "
        "ID.secret)."
    ),
]


def _device_ids(n: int) -> list[str]:
    return [f"device-{i}" for i in range(1, n + 1)]


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
    secure: Annotated[
        bool,
        typer.Option(
            help="Enrol the devices (tensorwire certs into OUT/certs) and run over TLS with "
            "per-device keys."
        ),
    ] = False,
) -> None:
    """Run a server here and the devices as local processes, with a progress bar."""
    from tensorwire.bench.progress import progress_bar
    from tensorwire.fl.run import run_local

    cfg = _config(locals())
    out = out or Path("results") / f"fl-{protocol}-{time.strftime('%Y%m%d-%H%M%S')}"
    certs = None
    if secure:
        from tensorwire.transports.certs import make_certs

        certs = out / "certs"
        make_certs(certs, hosts=["127.0.0.1", "localhost"], clients=_device_ids(cfg.clients))
    with progress_bar() as bar:
        task = bar.add_task(f"FedAvg over {protocol}", total=cfg.rounds)
        result, path = run_local(
            cfg, protocol, out_dir=out, on_round=lambda row: bar.advance(task), certs=certs
        )
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
    join_timeout: Annotated[float, typer.Option(help="Seconds to wait for all devices.")] = 120.0,
    round_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for a round's updates.")
    ] = 600.0,
    out: Out = None,
    certs: Certs = None,
    progress: Annotated[
        Path | None,
        typer.Option(help="Append JSON lines to this file: ready (hub URL), each round, done."),
    ] = None,
    progress_ack: Annotated[
        float,
        typer.Option(
            help="After each round wait up to this many seconds for PROGRESS.ack to hold the "
            "round's number (a watcher reads counters between rounds); 0: do not wait."
        ),
    ] = 0.0,
) -> None:
    """Serve FedAvg at URL until every round is done; devices join with `tensorwire fl client`."""
    from tensorwire.fl.results import write_run
    from tensorwire.fl.server import run_server

    cfg = _config(locals())
    events = ProgressFile(progress, progress_ack) if progress else None

    def ready(hub_url: str) -> None:
        console.print(f"serving at {hub_url}")
        if events:
            events.write("ready", url=hub_url)

    def round_done(row: dict[str, Any]) -> None:
        console.print(f"round {row['round']}: accuracy {row['accuracy']:.3f}")
        if events:
            events.round(row)

    result = run_server(url, cfg, on_ready=ready, on_round=round_done, certs=certs)
    _print_rounds(result.rounds)
    out = out or Path("results") / f"fl-server-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(f"results: {write_run(result, out, {'url': url})}")
    if events:
        events.write("done", out=str(out))


@fl_app.command("client")
def client_cmd(
    url: Annotated[str, typer.Option(help="The server's URL.")],
    id: Annotated[str, typer.Option("--id", help="This device's number or name.")],
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the server each round.")
    ] = 600.0,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads.")] = 1,
    certs: Certs = None,
) -> None:
    """Join the server at URL as device ID and train until it says done."""
    from tensorwire.fl.client import run_client

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    client_id = f"device-{id}" if id.isdigit() else id
    rounds = run_client(url, client_id, timeout=timeout, threads=threads, certs=certs)
    console.print(f"{client_id}: trained {rounds} rounds")
