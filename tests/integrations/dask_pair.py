"""One Dask message over a fresh tensorwire+tcp comm on loopback: what the other end read."""

from __future__ import annotations

import asyncio
from typing import Any

from distributed.comm import connect, listen

ADDR = "tensorwire+tcp://127.0.0.1"


async def one_message(msg: Any, timeout: float = 30.0) -> tuple[Any, int, Any]:
    """Write ``msg`` from a new comm to a new listener; (what the listener's comm read, what
    ``write`` returned, the writing comm, closed)."""
    got: asyncio.Queue[object] = asyncio.Queue()

    async def handle(comm: Any) -> None:
        await got.put(await comm.read())
        await comm.close()

    listener = await listen(ADDR, handle)
    comm = await connect(listener.contact_address, timeout=10)
    try:
        sent = await comm.write(msg)
        read = await asyncio.wait_for(got.get(), timeout)
    finally:
        await comm.close()
        listener.stop()
    return read, sent, comm
