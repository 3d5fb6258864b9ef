"""Federated learning on tensorwire: rounds that survive devices, validated updates,
strategies (FedAvg, FedProx, FedAdam, FedYogi, median, trimmed mean), crash-safe results and
resume, your own model and data (``serve`` / ``join``), update compression.

Needs the ``fl`` extra (torch, scikit-learn). Server and devices talk only through a URL.
The names below are imported on first use, so ``tensorwire.fl.config`` (the settings) can be
read without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "join": "api",
    "serve": "api",
    "run_client": "client",
    "FLConfig": "config",
    "CheckpointError": "errors",
    "FLError": "errors",
    "ModelMismatch": "errors",
    "QuorumLost": "errors",
    "UpdateRejected": "errors",
    "RunResult": "records",
    "run_server": "server",
    "FedAdam": "strategies",
    "FedAvg": "strategies",
    "FedProx": "strategies",
    "FedYogi": "strategies",
    "Median": "strategies",
    "RoundPlan": "strategies",
    "Strategy": "strategies",
    "TrimmedMean": "strategies",
    "Update": "strategies",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorwire.fl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tensorwire.fl.{module}"), name)
    globals()[name] = value
    return value
