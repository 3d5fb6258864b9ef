"""tensorwire+tcp checksums: on by default except to a loopback peer (no link lies between
the two copies of the bytes; the digests cost each side 0.15 s of CPU per 2 GB), set either
way by Dask config; a message written either way is read back whole, and a frame altered
on the way under a checksum closes the comm."""

from __future__ import annotations

import asyncio

import dask.config
import numpy as np
import pytest

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

from dask_pair import ADDR, one_message
from distributed.comm import CommClosedError, connect, listen

from tensorwire.integrations.dask.comm import comm_checksum
from tensorwire.wire import decode_message, encode_message

KEY = "distributed.comm.tensorwire.checksum"


@pytest.mark.parametrize(
    ("peer", "checked"),
    [
        (("127.0.0.1", 5000), False),
        (("127.3.4.5", 5000), False),
        (("::1", 5000, 0, 0), False),
        (("10.211.0.2", 5000), True),
        (("fe80::1%eth0", 5000, 0, 2), True),
        (None, True),  # no address known: checked
        ("/tmp/a-unix-socket", True),
    ],
)
def test_by_default_only_a_loopback_peer_goes_unchecked(peer, checked) -> None:
    assert comm_checksum(peer) is checked


@pytest.mark.parametrize(("setting", "checked"), [(True, True), ("true", True), (False, False)])
def test_the_config_says_always_or_never(setting, checked) -> None:
    with dask.config.set({KEY: setting}):
        assert comm_checksum(("127.0.0.1", 1)) is checked
        assert comm_checksum(("10.0.0.1", 1)) is checked


def test_a_wrong_setting_is_refused_by_name() -> None:
    with dask.config.set({KEY: "sometimes"}), pytest.raises(ValueError, match="checksum"):
        comm_checksum(("127.0.0.1", 1))


@pytest.mark.parametrize("setting", ["auto", True])
def test_a_loopback_comm_reads_back_what_it_wrote(tw_backend: str, setting) -> None:
    payload = np.random.default_rng(5).integers(0, 255, 6 << 20, dtype=np.uint8).tobytes()

    async def run() -> bool:
        msg, _, comm = await one_message({"op": "data", "x": payload})
        assert bytes(msg["x"]) == payload
        return bool(comm.checksum)

    with dask.config.set({KEY: setting}):
        assert asyncio.run(asyncio.wait_for(run(), 60)) is (setting is True)


def test_under_a_checksum_an_altered_frame_is_refused(tw_backend: str) -> None:
    """What the checksum is for: one flipped byte in a frame closes the reading comm."""
    enc = encode_message({"0": np.arange(1 << 16, dtype=np.uint8)}, codecs=None, checksum=True)
    wire = bytearray(b"".join(bytes(memoryview(f).cast("B")) for f in enc.frames()))
    decode_message(bytes(wire))  # whole: reads
    wire[len(wire) // 2] ^= 0xFF

    async def run() -> None:
        got: asyncio.Queue[BaseException | object] = asyncio.Queue()

        async def handle(comm) -> None:  # type: ignore[no-untyped-def]
            try:
                await got.put(await comm.read())
            except CommClosedError as e:
                await got.put(e)

        listener = await listen(ADDR, handle)
        comm = await connect(listener.contact_address, timeout=10)  # handshaken
        comm._protocol.outbox.put([bytes(wire)])  # the altered message, as it arrived
        result = await asyncio.wait_for(got.get(), 30)
        assert isinstance(result, CommClosedError), result
        assert "bad message" in str(result)
        comm.abort()
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
