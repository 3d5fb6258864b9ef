"""What the server trains and evaluates: the model factory, the test data, the shard sizes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensorwire.fl.config import CUSTOM, FLConfig
from tensorwire.fl.data import load_dataset, split_indices
from tensorwire.fl.task import ModelFactory, model_factory
from tensorwire.fl.train import ArrayData, LossFn, TrainingData, as_data


@dataclass
class ServerTask:
    """What the server trains and evaluates: the model ``factory``, the ``test`` data (or
    None: no evaluation), the ``loss_fn`` (cross-entropy if None) and, for a built-in data
    set, the size of each device's shard (an update may not claim more samples)."""

    factory: ModelFactory
    test: TrainingData | None = None
    loss_fn: LossFn | None = None
    shard_sizes: list[int] | None = None


def builtin_task(cfg: FLConfig, factory: ModelFactory | None = None) -> ServerTask:
    """The task of a built-in data set (``cfg.dataset``), split in ``cfg.clients`` shards."""
    data = load_dataset(cfg.dataset, root=cfg.data_root, seed=cfg.seed, clients=cfg.clients)
    shards = split_indices(data.train_y, cfg.clients, cfg.split, alpha=cfg.alpha, seed=cfg.seed)
    return ServerTask(
        factory=factory or model_factory(cfg.model, data.num_classes),
        test=ArrayData(data.test_x, data.test_y),
        shard_sizes=[len(s) for s in shards],
    )


def own_model_task(
    cfg: FLConfig | None, factory: ModelFactory, test_data: Any, loss_fn: LossFn | None
) -> ServerTask:
    """The task of a model of one's own, evaluated on ``test_data``: without it, on the
    built-in data set ``cfg`` names (if any), whose shards then bound the devices' updates."""
    test = as_data(test_data, "test_data") if test_data is not None else None
    if cfg is None or cfg.dataset == CUSTOM:
        return ServerTask(factory, test, loss_fn)
    base = builtin_task(cfg, factory)
    return ServerTask(factory, test or base.test, loss_fn, base.shard_sizes)
