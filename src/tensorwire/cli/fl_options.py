"""The options ``tensorwire fl run`` and ``fl server`` share: each an ``Annotated`` type whose
default comes from :class:`~tensorwire.fl.config.FLConfig`, and the checks they run before
anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from tensorwire.fl.config import (
    BUILTIN_DATASETS,
    BUILTIN_MODELS,
    DOWNLINK_MODES,
    LATE_POLICIES,
    STRATEGIES,
    UPLINK_COMPRESSORS,
    FLConfig,
    is_builtin_model,
    is_factory_ref,
)

D = FLConfig()  # the defaults
SPLITS = ("equal", "iid", "dirichlet")


def _check_model(value: str | None) -> str | None:
    """A built-in model, or a ``package.module:function`` that imports and is callable."""
    try:
        if value is None or is_builtin_model(value):
            return value
    except ValueError as exc:  # a payload too small
        raise typer.BadParameter(str(exc)) from None
    if not is_factory_ref(value):
        raise typer.BadParameter(
            f"{value!r}: choose {', '.join(BUILTIN_MODELS)}, payload:<size> (e.g. "
            "payload:10MB), or package.module:function"
        )
    from tensorwire.fl.errors import FLError
    from tensorwire.fl.task import import_factory

    try:
        import_factory(value)
    except FLError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


def _check_codec(value: str | None) -> str | None:
    """A lossless codec name the run accepts, checked before anything starts."""
    from tensorwire.fl.config import check_lossless

    try:
        if value is not None:
            check_lossless(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


Dataset = Annotated[
    Literal[BUILTIN_DATASETS],  # type: ignore[valid-type]
    typer.Option(help="digits (offline), cifar10 (from --data-root), synthetic."),
]
DataRoot = Annotated[Path | None, typer.Option(help="Folder holding CIFAR-10 (never downloaded).")]
Model = Annotated[
    str,
    typer.Option(
        callback=_check_model,
        help=f"{', '.join(BUILTIN_MODELS)}, or package.module:function returning a "
        "torch.nn.Module (the devices need it too: fl client --model).",
    ),
]
Clients = Annotated[
    int, typer.Option(min=1, help="Devices (data shards); waited for before the first round.")
]
Rounds = Annotated[int, typer.Option(min=1, help="Number of rounds.")]
Epochs = Annotated[int, typer.Option(min=1, help="Local epochs per round.")]
Batch = Annotated[int, typer.Option(min=1, help="Local batch size.")]
Lr = Annotated[float, typer.Option(help="Devices' SGD learning rate.")]
Momentum = Annotated[float, typer.Option(help="Devices' SGD momentum.")]
Split = Annotated[
    Literal[SPLITS],  # type: ignore[valid-type]
    typer.Option(help="equal (contiguous shards), iid, dirichlet."),
]
Alpha = Annotated[float, typer.Option(help="Dirichlet concentration for --split dirichlet.")]
Seed = Annotated[int, typer.Option(help="Seed of the model, data split, sampling, training.")]
Uplink = Annotated[
    Literal[UPLINK_COMPRESSORS],  # type: ignore[valid-type]
    typer.Option(help="Update compressor."),
]
Ratio = Annotated[float, typer.Option(help="Fraction kept by topk / randomk / dgc.")]
ErrorFeedback = Annotated[
    bool, typer.Option(help="Carry what compression dropped to the next round.")
]
Downlink = Annotated[
    Literal[DOWNLINK_MODES],  # type: ignore[valid-type]
    typer.Option(help="Global model: none, fp16, or delta (XOR with the last, zstd; lossless)."),
]
LosslessCodec = Annotated[
    str,
    typer.Option(
        "--codec",
        callback=_check_codec,
        help="Lossless codec of the model and the updates: auto (each tensor raw or "
        "compressed, whichever the measured link carries faster), none, or a codec id "
        "(lz4, zstd, blosc2 ...). A lossy --uplink / --downlink replaces it there.",
    ),
]
Fraction = Annotated[
    float, typer.Option(min=0.0, max=1.0, help="Fraction of the available devices per round.")
]
PerRound = Annotated[
    int | None, typer.Option(min=1, help="Devices per round (instead of --fraction).")
]
MinUpdates = Annotated[
    int,
    typer.Option(min=1, help="Quorum: valid updates a round needs to change the model."),
]
Late = Annotated[
    Literal[LATE_POLICIES],  # type: ignore[valid-type]
    typer.Option(help="A late update: discard, or stale (next round, weighted by its age)."),
]
Strategy = Annotated[
    Literal[STRATEGIES],  # type: ignore[valid-type]
    typer.Option(help="How updates are aggregated."),
]
Mu = Annotated[float, typer.Option(help="FedProx: the devices' proximal term.")]
ServerLr = Annotated[float, typer.Option(help="FedAdam / FedYogi: server step size.")]
Trim = Annotated[float, typer.Option(help="trimmed-mean: fraction cut at each end.")]
ClipNorm = Annotated[float | None, typer.Option(help="Scale each update down to this L2 norm.")]
MaxSamples = Annotated[
    int, typer.Option(min=1, help="The most samples an update may claim (own data).")
]
JoinTimeout = Annotated[
    float, typer.Option(help="Seconds to wait for --clients devices, or for a quorum.")
]
RoundTimeout = Annotated[float, typer.Option(help="A round's deadline, seconds.")]
Out = Annotated[Path | None, typer.Option(help="Results directory (written as rounds finish).")]
Certs = Annotated[
    Path | None,
    typer.Option(
        help="Directory from `tensorwire certs`: TLS and enrolled per-device keys (the hub "
        "needs hub.pem, hub.key, ca.pem, keys.json; a device ca.pem and its ID.pem, ID.key, "
        "ID.secret)."
    ),
]
