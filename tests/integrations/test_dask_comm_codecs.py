"""tensorwire+tcp with a codec: what the writer compresses, the reader decodes (the reader
once had no codec registry, so every compressed message closed the comm)."""

from __future__ import annotations

import asyncio

import dask.config
import numpy as np
import pytest

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

from dask_pair import one_message


@pytest.mark.parametrize("codec", ["zstd", "lz4", "floatplanes"])
def test_a_compressed_message_is_read_back_whole(tw_backend: str, codec: str) -> None:
    values = np.round(np.random.default_rng(4).random(1 << 20) * 100) / 100  # 8 MB, 101 values
    payload = values.tobytes()

    async def run() -> None:
        msg, sent, _ = await one_message({"op": "data", "x": payload})
        assert sent < 0.9 * len(payload)  # compressed on the wire
        assert bytes(msg["x"]) == payload

    with dask.config.set({"distributed.comm.tensorwire.codec": codec}):
        asyncio.run(asyncio.wait_for(run(), 60))
