"""Many devices in one process, a thread each: how a thousand devices fit a small machine.

Each device is a whole :func:`~tensorwire.fl.client.run_client` with its own channel, model
and data shard; they share the process's torch threads, and the data set is loaded once
(:func:`~tensorwire.fl.data.load_dataset`). A device that fails ends alone: the others go on.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from tensorwire.fl.client import run_client
from tensorwire.fl.task import model_factory

log = logging.getLogger("tensorwire.fl")


def device_ids(first: int, count: int) -> list[str]:
    """``device-first`` ... ``device-(first + count - 1)``."""
    if first < 1 or count < 1:
        raise ValueError(f"devices are numbered from 1 and come at least one: {first}, {count}")
    return [f"device-{i}" for i in range(first, first + count)]


def run_devices(
    url: str,
    client_ids: list[str],
    *,
    timeout: float = 600.0,
    threads: int = 1,
    certs: str | Path | None = None,
    model: str | None = None,
) -> dict[str, int | str]:
    """Run each of ``client_ids`` as a device of the server at ``url``, a thread each, until
    the server says the run is done; return per device the rounds it trained, or its error.

    ``model``: a ``package.module:function`` building the devices' model (the built-in ones
    need nothing); ``timeout``, ``threads`` (torch's, for the whole process) and ``certs``
    as for :func:`~tensorwire.fl.client.run_client`."""
    factory = model_factory(model) if model is not None else None
    results: dict[str, int | str] = {}

    def one(cid: str) -> None:
        try:
            results[cid] = run_client(
                url, cid, model=factory, timeout=timeout, threads=threads, certs=certs
            )
        except Exception as exc:  # one device's end is its own: the others go on
            log.warning("fl: device %s ended with %s: %s", cid, type(exc).__name__, exc)
            results[cid] = f"{type(exc).__name__}: {exc}"

    workers = [
        threading.Thread(target=one, args=(cid,), name=f"tensorwire-{cid}", daemon=True)
        for cid in client_ids
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return results
