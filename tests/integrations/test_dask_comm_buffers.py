"""tensorwire+tcp's buffers: a big message written to a peer that is not reading is never
copied into asyncio's transport (the outbox sends from its frames), a big message
received grows its buffer in place, and closing beside a peer that reads nothing ends within
its bound."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import time

import numpy as np
import pytest

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

from distributed.comm import connect, listen

from tensorwire.integrations.dask import comm as comm_module
from tensorwire.integrations.dask.protocol import FIRST_BYTES, MessageProtocol
from tensorwire.wire import Limits, encode_message

ADDR = "tensorwire+tcp://127.0.0.1"
BIG = 64 << 20


async def _pair():  # type: ignore[no-untyped-def]
    """A listener, a client comm and the server's end of it (which reads only when told)."""
    q: asyncio.Queue[object] = asyncio.Queue()

    async def handle(server_comm) -> None:  # type: ignore[no-untyped-def]
        await q.put(server_comm)

    listener = await listen(ADDR, handle)
    client = await connect(listener.contact_address, timeout=10)
    server = await asyncio.wait_for(q.get(), 10)
    return listener, client, server


def test_a_big_write_to_a_peer_not_reading_waits_in_the_outbox_not_in_a_copy(
    tw_backend: str,
) -> None:
    async def run() -> None:
        listener, client, server = await _pair()
        payload = np.random.default_rng(3).integers(0, 255, BIG, dtype=np.uint8).tobytes()
        await client.write({"op": "big", "x": payload})
        transport = client._protocol.transport
        # the socket took what it could; the rest waits as views of the frames, no copy of
        # it in asyncio's buffer
        assert transport.get_write_buffer_size() == 0
        outbox = client._protocol.outbox
        assert not outbox.empty and sum(v.nbytes for v in outbox._pending) > BIG // 2
        msg = await asyncio.wait_for(server.read(), 60)
        assert msg["op"] == "big" and bytes(msg["x"]) == payload
        await asyncio.wait_for(client._protocol.outbox.flushed(), 10)
        await client.close()
        await server.close()
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), 120))


def test_closing_beside_a_peer_that_reads_nothing_ends_within_its_bound(
    tw_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(comm_module, "CLOSE_FLUSH_S", 0.5)

    async def run() -> None:
        listener, client, server = await _pair()
        await client.write({"op": "big", "x": bytes(BIG)})
        started = time.monotonic()
        await client.close()
        assert time.monotonic() - started < 5 and client.closed()
        server.abort()
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_big_message_is_received_into_a_map_grown_in_place() -> None:
    body = np.arange(3 * FIRST_BYTES, dtype=np.uint8) * np.uint8(7)
    whole = encode_message({"0": body}).to_bytes()
    proto = MessageProtocol(Limits())
    sizes = []
    kinds = set()
    data = memoryview(whole)
    while data:
        buf = proto.get_buffer(-1)
        kinds.add(type(proto._buf))
        sizes.append(len(buf) + (len(whole) - len(data)))
        n = min(len(buf), len(data), 1 << 20)  # as a socket gives it: pieces
        buf[:n] = data[:n]
        del buf
        proto.buffer_updated(n)
        data = data[n:]
    assert len(proto._messages) == 1
    got = proto._messages[0]
    assert isinstance(got, mmap.mmap) and len(got) == len(whole)
    assert bytes(got) == whole
    assert max(sizes) == len(whole) and sorted(set(sizes))[1] <= FIRST_BYTES  # grew by steps
    # past the prefix, straight into the map: never a numpy array first, copied into it
    assert kinds == {bytearray, mmap.mmap}


def test_a_write_after_the_peer_died_raises_comm_closed_at_once(tw_backend: str) -> None:
    from distributed.comm.core import CommClosedError

    async def run() -> None:
        listener, client, server = await _pair()
        server.abort()  # the peer dies
        with pytest.raises(CommClosedError):
            for _ in range(200):  # polled: the loss reaches the client when the RST does
                await client.write({"op": "x", "pad": b"z" * 1000})
                await asyncio.sleep(0.01)
        assert client.closed()
        await client.close()  # returns at once: nothing waits to be flushed
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), 30))


@pytest.mark.skipif(
    not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"),
    reason="huge page advice is Linux's",
)
def test_a_big_message_map_is_advised_to_use_huge_pages() -> None:
    whole = encode_message({"0": np.ones(2 * FIRST_BYTES, np.uint8)}).to_bytes()
    proto = MessageProtocol(Limits())
    data = memoryview(whole)
    while data:
        buf = proto.get_buffer(-1)
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        del buf
        proto.buffer_updated(n)
        data = data[n:]
    got = proto._messages[0]
    addr = ctypes.addressof(ctypes.c_char.from_buffer(got))
    flags, inside = None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("VmFlags:"):
                flags = line.split()[1:]
                break
    assert flags is not None and "hg" in flags  # VM_HUGEPAGE: what MADV_HUGEPAGE sets


def test_a_peer_dying_while_the_outbox_waits_to_send_fails_the_reader(tw_backend: str) -> None:
    from distributed.comm.core import CommClosedError

    async def run() -> None:
        listener, client, server = await _pair()
        server._protocol.transport.pause_reading()  # the peer reads none of it
        # random bytes: zeros shrink under the comm's codec to less than a socket takes
        payload = np.random.default_rng(4).integers(0, 255, BIG, dtype=np.uint8).tobytes()
        await client.write({"op": "big", "x": payload})  # more than the sockets take
        assert not client._protocol.outbox.empty
        server.abort()  # the peer dies with the rest unsent: the next send fails
        with pytest.raises(CommClosedError):
            await asyncio.wait_for(client.read(), 10)
        assert client.closed() and client._protocol.outbox.empty
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), 30))


def test_a_burst_of_messages_is_read_with_fewer_loop_turns_than_recvs(tw_backend: str) -> None:
    async def run() -> None:
        listener, client, server = await _pair()
        lent = 0
        protocol = server._protocol
        get_buffer = protocol.get_buffer

        def counted(sizehint: int) -> memoryview:
            nonlocal lent
            lent += 1
            return get_buffer(sizehint)

        protocol.get_buffer = counted
        for i in range(50):  # queued before the server reads: one burst on the socket
            await client.write({"op": "small", "i": i, "pad": b"z" * 100})
        for i in range(50):
            assert (await asyncio.wait_for(server.read(), 10))["i"] == i
        # each message takes 2 recvs (prefix, rest); asyncio asks for a buffer once a turn
        assert 0 < lent < 50
        await client.close()
        await server.close()
        listener.stop()

    asyncio.run(asyncio.wait_for(run(), 30))
