"""The peers tensorwire is measured against, each used directly as its users would.

A baseline is a module here with:

- ``NAME``: its label in tables (e.g. ``"raw-socket"``, ``"pyzmq"``);
- ``class Sender``: built in the benchmark process, with ``receiver_args`` (a list of str
  handed to the receiver process), ``once(arr) -> seconds`` (send ``arr``, wait for the
  receiver's ack) and ``close()``;
- ``receive(args)``: the receiver process's loop (``python -m tensorwire.bench.peer
  baseline MODULE ARGS...``): receive each array into a reused buffer, ack it, return when
  the sender goes away.

A sender whose receiver cannot be an ordinary process on this host (WebRTC's, whose peers
need the testbed's namespaces) places it itself and has ``receiver_args = None``; one that
cannot run here raises :class:`BaselineUnavailable` saying why, and the benchmark goes on
without it.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


class BaselineUnavailable(RuntimeError):
    """A baseline that cannot run on this machine; the message says why and what would fix it."""


MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)))
"""Every baseline module here, by module name."""


def load(module: str) -> ModuleType:
    """The baseline module ``tensorwire.bench.baselines.<module>``."""
    return importlib.import_module(f"{__name__}.{module}")


def resolve(name: str) -> str:
    """The module of the baseline called ``name`` (its module name or its table label, e.g.
    ``socket`` or ``raw-socket``); ``ValueError`` naming the choices if there is none."""
    if name in MODULES:
        return name
    labels = {}
    for module in MODULES:
        try:
            labels[load(module).NAME] = module
        except ImportError:  # its library is not installed: it cannot be the one meant
            continue
    if name in labels:
        return labels[name]
    choices = ", ".join(f"{m} ({label})" for label, m in sorted(labels.items()))
    raise ValueError(f"no baseline {name!r}; choose from: {choices}")
