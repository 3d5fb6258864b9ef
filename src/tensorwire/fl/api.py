"""Federated learning with your own model and data: ``serve`` on the server, ``join`` on
each device.

``model`` is any function that returns a ``torch.nn.Module`` (every device calls its own; the
server seeds torch and calls its own for the initial model), or a built-in name (``vgg5``,
``vgg8``). Data is a ``torch.utils.data.Dataset``, a ``DataLoader`` or a pair of arrays
``(x, y)``. The built-in runs (VGG-5/VGG-8 on digits/CIFAR-10) are this API with
``dataset="digits"`` and no data of one's own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tensorwire.fl.client import run_client
from tensorwire.fl.config import CUSTOM, STRATEGIES, FLConfig
from tensorwire.fl.records import RunResult
from tensorwire.fl.server import FLServer
from tensorwire.fl.server.task import own_model_task
from tensorwire.fl.strategies import Strategy
from tensorwire.fl.task import ModelFactory, factory_name, model_factory
from tensorwire.fl.train import LossFn
from tensorwire.transports import default_client_id


def serve(
    url: str,
    *,
    model: ModelFactory | str,
    test_data: Any = None,
    strategy: str | Strategy = "fedavg",
    rounds: int = 5,
    clients: int = 2,
    loss_fn: LossFn | None = None,
    out_dir: str | Path | None = None,
    resume: str | Path | None = None,
    certs: str | Path | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_ready: Callable[[str], None] | None = None,
    **settings: Any,
) -> RunResult:
    """Serve ``rounds`` rounds of federated training of ``model`` at ``url``; return the rows.

    ``test_data`` is evaluated after every round (accuracy and loss with ``loss_fn``,
    cross-entropy by default). ``strategy``: ``fedavg``, ``fedprox``, ``fedadam``,
    ``fedyogi``, ``median``, ``trimmed-mean``, or a :class:`Strategy`. ``clients`` devices
    are waited for before the first round. ``settings`` are :class:`FLConfig` fields:
    ``fraction``, ``clients_per_round``, ``min_updates`` (the quorum), ``round_timeout``
    (the deadline, s), ``late``, ``epochs``, ``batch_size``, ``lr``, ``clip_norm``,
    ``max_samples``, ``seed`` ... (``dataset="digits"`` trains on the built-in data set).
    ``out_dir`` gets the results as rounds finish, and checkpoints; ``resume`` (such a
    directory) goes on from its last checkpoint, with the settings saved there.
    """
    factory = model_factory(model)
    name = model if isinstance(model, str) else factory_name(factory)
    if isinstance(strategy, Strategy):
        settings.setdefault("strategy", strategy.name if strategy.name in STRATEGIES else CUSTOM)
    else:
        settings.setdefault("strategy", strategy)
    cfg = FLConfig(
        **{"dataset": CUSTOM, "model": name, "rounds": rounds, "clients": clients, **settings}
    )
    return FLServer(
        url,
        cfg,
        task=own_model_task(cfg, factory, test_data, loss_fn),
        strategy=strategy if isinstance(strategy, Strategy) else None,
        out_dir=out_dir,
        resume=resume,
        on_round=on_round,
        on_ready=on_ready,
        certs=certs,
    ).run()


def join(
    url: str,
    *,
    model: ModelFactory | str | None = None,
    train_data: Any = None,
    client_id: str | None = None,
    loss_fn: LossFn | None = None,
    timeout: float = 600.0,
    threads: int = 1,
    certs: str | Path | None = None,
) -> int:
    """Join the run at ``url`` as ``client_id`` and train ``model`` on ``train_data`` in
    every round this device is sampled for, until the server says the run is done; return
    the number of rounds trained.

    Without ``train_data`` the device trains on its shard of the server's built-in data set
    (its id ``device-N`` picks shard N). ``timeout``: seconds to wait for the server to
    answer (to connect, and to come back after it went away).
    """
    factory = model_factory(model) if model is not None else None
    return run_client(
        url,
        client_id or default_client_id(),
        model=factory,
        train_data=train_data,
        loss_fn=loss_fn,
        timeout=timeout,
        threads=threads,
        certs=certs,
    )
