"""A flight:// hub's threads are bounded whatever its clients do (issue #27): gRPC's
synchronous server holds a thread per call until the call ends, and pyarrow gives a hub no way
to end a call from another thread, so the hub bounds the calls it takes in: a client id's
sessions hold at most CALLS_PER_CLIENT calls, and past the hub's limit a call is refused at
once as busy (gRPC UNAVAILABLE), which a channel retries with backoff.

Threads are counted in /proc (``threading`` does not see gRPC's): the server's own, named
``grpcpp_sync_server`` (the clients of these tests, in the same process, make none)."""

from __future__ import annotations

import os
import uuid
from typing import Any

import numpy as np
import pytest
from waiting import until

flight = pytest.importorskip(
    "pyarrow.flight", reason="flight:// needs pyarrow (extra tensorwire[flight])"
)

import tensorwire  # noqa: E402
from tensorwire.errors import TransportTimeout  # noqa: E402
from tensorwire.transports.flight.options import SCHEMA, UP  # noqa: E402
from tensorwire.transports.session import ClientSession  # noqa: E402
from tensorwire.transports.url import host_port  # noqa: E402

T = 30.0
PER_CLIENT = 6  # CALLS_PER_CLIENT: a client id's sessions' live calls
SPARE = 4  # threads gRPC's server keeps beyond its calls' (it polls for new calls on them)


def server_threads() -> int:
    """Threads of gRPC's synchronous server in this process: one per call, and a few spare."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().startswith("grpcpp_sync")
        except OSError:  # the thread ended as we looked
            pass
    return count


class Raw:
    """A session opened with pyarrow alone, that then does nothing: it never reads what the
    hub writes, never writes, never hangs up, until :meth:`close`."""

    def __init__(self, url: str, client_id: str) -> None:
        self.client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(url)))
        session = ClientSession(client_id, decoders=[], max_message_bytes=1 << 30)
        self.calls: list[Any] = []  # readers, which cancel their calls
        self.refused: str | None = None  # a refusal that came as a call was opened
        try:
            writer, down = self.client.do_exchange(
                flight.FlightDescriptor.for_command(session.hello().to_bytes())
            )
            self.calls.append(down)
            writer.done_writing()
            up, up_call = self.client.do_exchange(
                flight.FlightDescriptor.for_path(*UP, session.session)
            )
            self.calls.append(up_call)
            self.writers = (writer, up)  # kept: dropping one closes its call
            up.begin(SCHEMA)
        except flight.FlightUnavailableError as exc:
            self.refused = self.refused or str(exc)
        except OSError:  # the hub ended the uplink already (its downlink was refused)
            pass

    def refusal(self) -> str:
        """The error the hub ended the downlink with (the hub writes nothing before it)."""
        if self.refused is not None:
            return self.refused
        with pytest.raises(flight.FlightUnavailableError) as info:
            self.calls[0].read_chunk()
        return str(info.value)

    def close(self) -> None:
        for call in self.calls:
            call.cancel()
        self.client.close()


def probe(url: str, how: str) -> Any:
    """One call of another kind than a session's, with garbage; returns its reader."""
    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(url)))
    if how == "get":
        return client.do_get(flight.Ticket(b"\x00garbage"))
    if how == "put":
        writer, _ = client.do_put(flight.FlightDescriptor.for_path("x"), SCHEMA)
        return writer
    _, reader = client.do_exchange(flight.FlightDescriptor.for_command(b"not a hello"))
    return reader


def busy_error(url: str, how: str) -> str:
    with pytest.raises(flight.FlightUnavailableError) as info:
        call = probe(url, how)
        if how == "put":
            call.close()
        else:
            call.read_all()
    return str(info.value)


def test_a_device_that_redials_without_ending_its_sessions_holds_a_bounded_number_of_threads():
    """Each replaced session of a client that never hangs up keeps its uplink blocked in a
    read the hub cannot end: past PER_CLIENT calls its id's hellos are refused as busy, at
    once, and their uplinks end with them; another device still joins."""
    with tensorwire.serve("flight://127.0.0.1:0") as hub:
        base = server_threads()
        raws = []
        try:
            for _ in range(12):
                raws.append(Raw(hub.url, "stuck"))
                assert until(lambda: hub._handshakes == 0, T)
                assert until(lambda: server_threads() <= base + PER_CLIENT + SPARE, T), (
                    server_threads(),
                    base,
                )
            assert hub.clients == ["stuck"]
            assert "busy" in raws[-1].refusal()
            with tensorwire.connect(hub.url, client_id="device", timeout=T) as device:
                hub.send("device", {"w": np.arange(4.0)}, timeout=T)
                assert device.recv(timeout=T).tensors["w"].tolist() == [0, 1, 2, 3]
        finally:
            for raw in raws:
                raw.close()
        assert until(lambda: server_threads() <= base + SPARE, T)


def test_a_flood_of_calls_past_the_limit_is_refused_as_busy_and_a_device_still_talks():
    """max_calls=12: a device and five raw sessions fill it; any call more (a session's, or
    do_get / do_put / do_exchange with garbage) is refused at once with UNAVAILABLE "busy",
    which a channel reports as busy; the threads stay under the limit; the device talks on,
    and another joins once room is made."""
    with tensorwire.serve("flight://127.0.0.1:0?max_calls=12") as hub:
        base = server_threads()
        device = tensorwire.connect(hub.url, client_id="device", timeout=T)
        raws = []
        try:
            for i in range(5):
                raws.append(Raw(hub.url, f"raw{i}"))
            assert until(lambda: len(hub.clients) == 6, T), hub.clients
            extra = [Raw(hub.url, f"extra{i}") for i in range(3)]
            raws += extra
            for raw in extra:
                assert "tensorwire hub busy" in raw.refusal()
            for how in ("get", "put", "exchange") * 3:
                assert "tensorwire hub busy" in busy_error(hub.url, how)
            with pytest.raises(TransportTimeout, match="is busy"):
                tensorwire.connect(hub.url, client_id="late", timeout=1.0)
            assert server_threads() <= base + 12 + SPARE
            hub.send("device", {"w": np.ones(3)}, timeout=T)
            assert device.recv(timeout=T).tensors["w"].tolist() == [1, 1, 1]
            device.send({"u": np.zeros(2)}, timeout=T)
            assert hub.recv(timeout=T)[1].tensors["u"].tolist() == [0, 0]
            raws[0].close()  # room for one session
            with tensorwire.connect(hub.url, client_id="late", timeout=T) as late:
                hub.send("late", {"w": np.ones(1)}, timeout=T)
                assert late.recv(timeout=T).tensors["w"].tolist() == [1]
        finally:
            device.close()
            for raw in raws:
                raw.close()
        assert until(lambda: server_threads() <= base + SPARE, T)


def test_a_client_that_stops_reading_is_dropped_at_the_deadline_and_its_redials_are_bounded():
    """A member that reads nothing: a send to it ends its session at the send's deadline;
    its downlink's thread stays blocked in gRPC's write until the client reads or hangs up
    (pyarrow cannot end it), so the id's redials are refused as busy past PER_CLIENT calls,
    and every thread is back once the client hangs up."""
    with tensorwire.serve("flight://127.0.0.1:0") as hub:
        base = server_threads()
        stalled = [Raw(hub.url, "stalled")]
        try:
            assert hub.wait_for(1, timeout=T) == ["stalled"]
            big = {"w": np.frombuffer(os.urandom(64 << 20), np.uint8)}  # beyond every window
            with pytest.raises(TransportTimeout):
                hub.send("stalled", big, timeout=2.0)
            assert until(lambda: "stalled" not in hub.clients, T)
            assert any(e.kind == "left" and "timed out" in e.reason for e in hub.events)
            for _ in range(6):
                stalled.append(Raw(hub.url, "stalled"))
                assert until(lambda: hub._handshakes == 0, T)
            assert "busy" in stalled[-1].refusal()
            assert server_threads() <= base + PER_CLIENT + SPARE
        finally:
            for raw in stalled:
                raw.close()
        assert until(lambda: server_threads() <= base + SPARE, T)
        name = f"d{uuid.uuid4().hex[:6]}"
        with tensorwire.connect(hub.url, client_id=name, timeout=T):
            assert hub.wait_for(1, timeout=T) == [name]
