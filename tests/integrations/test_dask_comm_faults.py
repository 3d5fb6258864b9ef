"""tensorwire+tcp comms when the peer dies, hangs, lies or floods: typed errors, no hang."""

from __future__ import annotations

import asyncio
import contextlib
import struct

import pytest

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

from distributed.comm import connect, listen
from distributed.comm.addressing import parse_host_port
from distributed.comm.core import CommClosedError

from tensorwire.wire import encode_message

ADDR = "tensorwire+tcp://127.0.0.1"
BOUND_S = 20  # every test's wall bound


async def _echo_listener(served: list[object]):  # type: ignore[no-untyped-def]
    async def handle(comm):  # type: ignore[no-untyped-def]
        try:
            while True:
                msg = await comm.read()
                served.append(msg)
                await comm.write(msg)
        except CommClosedError:
            pass

    return await listen(ADDR, handle)


async def _raw_socket(listener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:  # type: ignore[no-untyped-def]
    host, port = parse_host_port(listener.contact_address.split("://", 1)[1])
    return await asyncio.open_connection(host, port)


async def _dropped(reader: asyncio.StreamReader) -> None:
    """The listener closed this peer's connection (EOF or reset), within 5 s."""
    with contextlib.suppress(ConnectionResetError):
        await asyncio.wait_for(reader.read(), 5)  # to EOF


async def _still_serves(listener) -> None:  # type: ignore[no-untyped-def]
    comm = await connect(listener.contact_address, timeout=5)
    await comm.write({"op": "ping", "n": 7})
    assert await asyncio.wait_for(comm.read(), 5) == {"op": "ping", "n": 7}
    await comm.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\n\r\n" + b"x" * 64,  # not tensorwire at all
        b"TWR" + b"\xff" * 40,  # bad magic / version
        encode_message({"0": __import__("numpy").zeros(10, "f4")}).to_bytes(),  # not uint8
    ],
    ids=["http", "bad-prefix", "wrong-dtype"],
)
def test_garbage_from_a_peer_is_refused_and_others_are_served(
    tw_backend: str, garbage: bytes
) -> None:
    async def run() -> None:
        served: list[object] = []
        listener = await _echo_listener(served)
        reader, writer = await _raw_socket(listener)
        writer.write(garbage)  # in place of the handshake: the listener drops this peer
        await writer.drain()
        await _still_serves(listener)
        await _dropped(reader)
        writer.close()
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), BOUND_S))


def test_declared_size_over_the_limit_is_refused_before_reading_it(tw_backend: str) -> None:
    import dask

    async def run() -> None:
        listener = await _echo_listener([])
        good = encode_message({"0": __import__("numpy").zeros(8, "u1")}).to_bytes()
        # a prefix that declares a 1 TB body: refused from the prefix, nothing allocated
        liar = bytearray(good[:24])
        struct.pack_into("<Q", liar, 16, 1 << 40)
        reader, writer = await _raw_socket(listener)
        writer.write(bytes(liar))
        await writer.drain()
        await _still_serves(listener)
        await _dropped(reader)
        writer.close()
        listener.stop()

    with dask.config.set({"distributed.comm.tensorwire.max-message-bytes": 1 << 30}):
        asyncio.run(asyncio.wait_for(run(), BOUND_S))


def test_peer_dies_mid_message_gives_comm_closed(tw_backend: str) -> None:
    async def run() -> None:
        got: asyncio.Queue[BaseException | object] = asyncio.Queue()

        async def handle(comm) -> None:  # type: ignore[no-untyped-def]
            try:
                await got.put(await comm.read())
            except BaseException as e:
                await got.put(e)

        listener = await listen(ADDR, handle)
        comm = await connect(listener.contact_address)
        # a real message's first half, then the connection dies
        whole = encode_message({"0": __import__("numpy").ones(1 << 16, "u1")}).to_bytes()
        comm._writer.write(whole[: len(whole) // 2])  # type: ignore[attr-defined]
        comm.abort()
        err = await asyncio.wait_for(got.get(), 10)
        assert isinstance(err, CommClosedError)
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), BOUND_S))


def test_peer_hangs_mid_message_read_times_out_typed_and_comm_is_dropped(tw_backend: str) -> None:
    async def run() -> None:
        q: asyncio.Queue[object] = asyncio.Queue()

        async def handle(comm) -> None:  # type: ignore[no-untyped-def]
            await q.put(comm)

        listener = await listen(ADDR, handle)
        comm = await connect(listener.contact_address)
        server_comm = await asyncio.wait_for(q.get(), 10)
        whole = encode_message({"0": __import__("numpy").ones(4096, "u1")}).to_bytes()
        comm._writer.write(whole[:30])  # type: ignore[attr-defined]  # then silence
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(server_comm.read(), 0.5)  # type: ignore[attr-defined]
        assert server_comm.closed()  # type: ignore[attr-defined]
        with pytest.raises(CommClosedError):
            await server_comm.read()  # type: ignore[attr-defined]
        comm.abort()
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), BOUND_S))


def test_flood_of_connections_and_messages_is_served_in_bounded_time(tw_backend: str) -> None:
    async def run() -> None:
        served: list[object] = []
        listener = await _echo_listener(served)

        async def one(i: int) -> None:
            comm = await connect(listener.contact_address, timeout=10)
            for j in range(20):
                await comm.write({"i": i, "j": j, "pad": b"z" * 1000})
            for j in range(20):
                msg = await comm.read()
                assert msg["j"] == j and msg["i"] == i
            await comm.close()

        await asyncio.gather(*(one(i) for i in range(50)))  # 50 peers x 20 messages
        assert len(served) == 1000
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_large_declared_size_allocates_only_what_arrives() -> None:
    import numpy as np

    from tensorwire.integrations.dask.protocol import FIRST_BYTES, MessageProtocol
    from tensorwire.wire import Limits

    proto = MessageProtocol(Limits())
    whole = bytearray(encode_message({"0": np.ones(64, "u1")}).to_bytes())
    struct.pack_into("<Q", whole, 16, 8 << 30)  # the prefix now declares an 8 GiB body

    def feed(data: bytes) -> None:
        while data:
            buf = proto.get_buffer(-1)
            n = min(len(buf), len(data))
            buf[:n] = data[:n]
            proto.buffer_updated(n)
            data = data[n:]

    feed(bytes(whole))  # the prefix and about 100 bytes more, then nothing
    assert len(proto.get_buffer(-1)) + len(whole) <= FIRST_BYTES  # 16 MiB held, not 8 GiB
    assert not proto._messages
