"""Plugins: what other installed packages add to tensorwire through entry points.

A package registers a transport or a codec in its own metadata, without editing tensorwire::

    [project.entry-points."tensorwire.transports"]
    toy = "toy_plugin:ENTRY"          # a tensorwire.transports.TransportEntry

    [project.entry-points."tensorwire.codecs"]
    toyxor = "toy_plugin:ToyXor"      # a Codec class with a codec_id

Each group is read once, the first time tensorwire looks for a scheme or a codec it does not
know, or lists them all. A plugin that fails to load is logged with its package and skipped:
one broken package must not take tensorwire's own transports and codecs with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

TRANSPORTS = "tensorwire.transports"
CODECS = "tensorwire.codecs"

log = logging.getLogger("tensorwire.plugins")
_started: set[str] = set()  # groups being or already read
_done: set[str] = set()  # groups read whole
# another thread asking meanwhile waits for the whole group; the loading thread itself (a
# plugin whose import asks for a scheme or codec) goes on with what is registered so far
_loading = threading.RLock()


def load_group(group: str, register: Callable[[Any], object]) -> None:
    """Hand each object the installed packages name under ``group`` to ``register``, once
    per process."""
    if group in _done:
        return
    with _loading:
        if group in _started:
            return
        _started.add(group)
        _register_all(group, register)
        _done.add(group)


def _register_all(group: str, register: Callable[[Any], object]) -> None:
    for ep in entry_points(group=group):
        where = f"{ep.name} = {ep.value}" + (f" (from {ep.dist.name})" if ep.dist else "")
        try:
            register(ep.load())
        except Exception as exc:  # a third party's bug: say so, keep the rest working
            log.warning(
                "tensorwire: skipped the plugin %s in %s: %s: %s",
                where,
                group,
                type(exc).__name__,
                exc,
            )
