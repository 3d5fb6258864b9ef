"""tensorwire+tcp with a codec: what the writer compresses, the reader decodes (the reader
once had no codec registry, so every compressed message closed the comm)."""

from __future__ import annotations

import asyncio

import dask.config
import numpy as np
import pytest

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

from distributed.comm import connect, listen

ADDR = "tensorwire+tcp://127.0.0.1"


@pytest.mark.parametrize("codec", ["zstd", "lz4", "floatplanes"])
def test_a_compressed_message_is_read_back_whole(tw_backend: str, codec: str) -> None:
    values = np.round(np.random.default_rng(4).random(1 << 20) * 100) / 100  # 8 MB, 101 values
    payload = values.tobytes()

    async def run() -> None:
        got: asyncio.Queue[object] = asyncio.Queue()

        async def handle(comm) -> None:  # type: ignore[no-untyped-def]
            await got.put(await comm.read())
            await comm.close()

        listener = await listen(ADDR, handle)
        comm = await connect(listener.contact_address, timeout=10)
        sent = await comm.write({"op": "data", "x": payload})
        assert sent < 0.9 * len(payload)  # compressed on the wire
        msg = await asyncio.wait_for(got.get(), 30)
        assert bytes(msg["x"]) == payload  # type: ignore[index]
        await comm.close()
        listener.stop()

    with dask.config.set({"distributed.comm.tensorwire.codec": codec}):
        asyncio.run(asyncio.wait_for(run(), 60))
