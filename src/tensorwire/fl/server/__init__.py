"""The FL server: rounds of sampled devices with a deadline and a quorum.

Each round samples devices among those available (connected, set up, not still working on an
earlier round), sends them the global model (a delta only to a device that holds the last
one), and waits until every sampled device has answered or left, or the deadline passes.
Each update is validated as it arrives (rejected ones are recorded and the device is told);
if at least the quorum of valid updates came, the strategy aggregates them, otherwise the
model stays as it was. A late update is recorded and dropped, or kept for the next
aggregation with a staleness weight. Results and a checkpoint are written after every round;
the run stops only when fewer devices than the quorum remain, with :class:`QuorumLost`
naming each missing device and why.

The server talks to devices only through a tensorwire URL, so it runs unchanged over every
transport. Shaped as Flower's server is: a device manager (membership and sampling), the
strategy (it configures a round and aggregates it), and a thin round loop:

- :mod:`.device_manager`: the devices, who is available, sampling, shards;
- :mod:`.round`: one round's state and its row;
- :mod:`.updates`: devices' updates, validated, taken in time, late or rejected;
- :mod:`.downlink`: the global model going out, whole or as a delta;
- :mod:`.outbox`: messages to devices, sent by threads;
- :mod:`.recorder`: the run's rows and results directory;
- :mod:`.checkpoints`: what is saved after every round and taken back to resume;
- :mod:`.task`: the model and test data;
- :mod:`.loop`: :class:`FLServer`, the round loop.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tensorwire.fl.config import FLConfig
from tensorwire.fl.errors import FLError, QuorumLost
from tensorwire.fl.records import RunResult
from tensorwire.fl.server.loop import FLServer
from tensorwire.fl.server.task import ServerTask, builtin_task, own_model_task
from tensorwire.fl.strategies import Strategy
from tensorwire.fl.task import ModelFactory
from tensorwire.fl.train import LossFn


def run_server(
    url: str,
    cfg: FLConfig | None = None,
    *,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_ready: Callable[[str], None] | None = None,
    certs: str | Path | None = None,
    out_dir: str | Path | None = None,
    resume: str | Path | None = None,
    model: ModelFactory | None = None,
    test_data: Any = None,
    loss_fn: LossFn | None = None,
    strategy: Strategy | None = None,
    hub_options: dict[str, Any] | None = None,
) -> RunResult:
    """Serve ``cfg.rounds`` rounds at ``url`` (see :class:`FLServer`); return the result.

    ``model`` (a factory) and ``test_data`` replace the built-in ones; without ``model`` the
    model is ``cfg.model`` and the data ``cfg.dataset``, split into ``cfg.clients`` shards.
    """
    if model is None and test_data is not None:
        raise FLError("test_data needs its model: run_server(..., model=make_model)")
    return FLServer(
        url,
        cfg,
        task=own_model_task(cfg, model, test_data, loss_fn) if model is not None else None,
        strategy=strategy,
        out_dir=out_dir,
        resume=resume,
        on_round=on_round,
        on_ready=on_ready,
        certs=certs,
        hub_options=hub_options,
    ).run()


__all__ = [
    "FLError",
    "FLServer",
    "QuorumLost",
    "RunResult",
    "ServerTask",
    "builtin_task",
    "run_server",
]
