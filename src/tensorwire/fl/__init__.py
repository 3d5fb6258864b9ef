"""Federated learning on tensorwire: FedAvg, VGG-5 / VGG-8, digits / CIFAR-10, update compression.

Needs the ``fl`` extra (torch, scikit-learn). Server and devices talk only through a URL.
"""

from tensorwire.fl.config import FLConfig
from tensorwire.fl.server import FLError, RunResult, run_server

__all__ = ["FLConfig", "FLError", "RunResult", "run_server"]
