"""The peers tensorwire is measured against, each used directly as its users would.

A baseline is a module here with:

- ``NAME``: its label in tables (e.g. ``"raw-socket"``, ``"pyzmq"``);
- ``class Sender``: built in the benchmark process, with ``receiver_args`` (a list of str
  handed to the receiver process), ``once(arr) -> seconds`` (send ``arr``, wait for the
  receiver's ack) and ``close()``;
- ``receive(args)``: the receiver process's loop (``python -m tensorwire.bench.peer
  baseline MODULE ARGS...``): receive each array into a reused buffer, ack it, return when
  the sender goes away.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def load(module: str) -> ModuleType:
    """The baseline module ``tensorwire.bench.baselines.<module>``."""
    return importlib.import_module(f"{__name__}.{module}")
