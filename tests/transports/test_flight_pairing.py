"""A flight:// hub pairs a session's two calls (issue #27): each waiting call is woken by its
own other half, not by every event; calls that never pair are bounded in all and per host,
the oldest pushed out, so they cannot keep a device out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from waiting import until

flight = pytest.importorskip(
    "pyarrow.flight", reason="flight:// needs pyarrow (extra tensorwire[flight])"
)

import tensorwire  # noqa: E402
from tensorwire.errors import SessionRefused  # noqa: E402
from tensorwire.transports.flight import hub as flight_hub  # noqa: E402
from tensorwire.transports.flight.batches import control_message  # noqa: E402
from tensorwire.transports.flight.options import HANDSHAKE_TIMEOUT, UP  # noqa: E402
from tensorwire.transports.flight.pairing import Pairing  # noqa: E402
from tensorwire.transports.flight.peer import Peer  # noqa: E402
from tensorwire.transports.session import HELLO_LIMITS, ClientSession, HubSession  # noqa: E402
from tensorwire.transports.url import host_port  # noqa: E402

T = 20.0


def _peer(client_id: str, tls_name: str | None = None) -> Peer:
    hub_session = HubSession(decoders=[], max_message_bytes=1 << 20)
    hello = ClientSession(client_id, decoders=[], max_message_bytes=1 << 20).hello()
    hub_session.receive(control_message(hello.to_bytes(), HELLO_LIMITS))
    assert hub_session.hello is not None
    return Peer(hub_session.hello, hub_session, tls_name, post=lambda fn, *args: fn(*args))


def _downlink_only(url: str, client_id: str) -> tuple[flight.FlightClient, Any, Any]:
    """A session's first call, with a valid hello, and never its second (the writer is
    kept: dropping it closes the call, which waits for the hub to end it)."""
    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(url)))
    session = ClientSession(client_id, decoders=[], max_message_bytes=1 << 20)
    hello = flight.FlightDescriptor.for_command(session.hello().to_bytes())
    writer, down = client.do_exchange(hello)
    writer.done_writing()
    return client, writer, down


def _uplink_only(url: str, session: str) -> tuple[flight.FlightClient, Any, Any]:
    """A session's second call, for a session whose first never comes."""
    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(url)))
    up = flight.FlightDescriptor.for_path(*UP, session)
    writer, call = client.do_exchange(up)
    return client, writer, call


def _far() -> float:
    return time.monotonic() + T


def test_calls_pair_in_either_order_and_wake_only_their_other_half():
    pairing = Pairing(8, 8)
    first, second = _peer("a"), _peer("b")
    down = pairing.downlink(first, "h", 0.0)
    early_up = pairing.uplink(second.hello.session, "h", None, 0.0)  # before its downlink
    assert down is not None and early_up is not None and len(pairing) == 2
    up = pairing.uplink(first.hello.session, "h", None, 0.0)
    assert up is not None and up.peer is first and first.attached
    assert down.ready.is_set() and not early_up.ready.is_set()  # the other waiter slept on
    late_down = pairing.downlink(second, "h", 0.0)
    assert late_down is not None and late_down.ready.is_set() and early_up.peer is second
    assert len(pairing) == 0


def test_a_stolen_session_id_pairs_with_nothing_and_a_reused_one_is_refused():
    pairing = Pairing(8, 8)
    victim = _peer("v", tls_name="v")
    pairing.downlink(victim, "h", 0.0)
    with pytest.raises(SessionRefused, match="another certificate"):
        pairing.uplink(victim.hello.session, "h", "someone-else", 0.0)
    assert not victim.attached
    with pytest.raises(SessionRefused, match="already opening"):
        pairing.downlink(Peer(victim.hello, victim.session, "v", post=victim.post), "h", 0.0)
    # an uplink under another certificate that came first is dropped when its downlink comes
    owner = _peer("o", tls_name="o")
    thief = pairing.uplink(owner.hello.session, "h", "someone-else", 0.0)
    assert thief is not None
    assert pairing.uplink(owner.hello.session, "h", "o", 0.0) is None  # one waits already
    down = pairing.downlink(owner, "h", 0.0)
    assert down is not None and not down.ready.is_set() and not owner.attached
    assert thief.ready.is_set() and thief.peer is None and "another certificate" in thief.dropped
    up = pairing.uplink(owner.hello.session, "h", "o", 0.0)
    assert up is not None and up.peer is owner and owner.attached


def test_calls_that_never_pair_push_out_only_the_oldest_of_their_own_host():
    pairing = Pairing(total=6, per_source=3)
    strangers = [pairing.downlink(_peer(f"s{i}"), "stranger", float(i)) for i in range(5)]
    device = pairing.downlink(_peer("device"), "device-host", 9.0)
    assert all(w is not None for w in strangers) and device is not None
    assert [w.dropped is not None for w in strangers] == [True, True, False, False, False]
    assert all(w.ready.is_set() for w in strangers[:2])  # woken, to end their calls
    assert device.dropped is None and len(pairing) == 4


def test_a_waiting_call_gives_up_when_cancelled_or_at_its_deadline_and_close_wakes_all():
    async def run() -> None:
        pairing = Pairing(8, 8)
        w = pairing.downlink(_peer("a"), "h", 0.0)
        assert w is not None
        assert not await w.wait(0.05)  # the deadline
        waiting = asyncio.create_task(w.wait(T))
        await asyncio.sleep(0)
        waiting.cancel()  # its client hung up
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert pairing.withdraw(False, w.peer.hello.session, w) and len(pairing) == 0
        other = pairing.downlink(_peer("b"), "h", 0.0)
        assert other is not None
        waiting = asyncio.create_task(other.wait(T))
        await asyncio.sleep(0)
        pairing.close()
        assert not await asyncio.wait_for(waiting, T)
        assert other.dropped == "the hub is closing"
        assert pairing.downlink(_peer("c"), "h", 0.0) is None

    asyncio.run(run())


def test_calls_that_never_pair_cannot_keep_a_device_out(monkeypatch):
    """The hostile case end to end: a host holds the most downlinks and the most uplinks it
    may, each waiting for a call that never comes; a device still joins at once. Its two
    calls reach the hub in either order (each is a task of the hub's loop): the first
    pushes out the oldest waiting call of its kind, the second pairs with it."""
    monkeypatch.setattr(flight_hub, "MAX_HANDSHAKES", 3)  # read as a hub is made
    monkeypatch.setattr(flight_hub, "MAX_HANDSHAKES_PER_SOURCE", 3)
    with tensorwire.serve("flight://127.0.0.1:0") as hub:
        silent = [_downlink_only(hub.url, f"silent{i}") for i in range(3)]
        assert until(lambda: hub._handshakes == 3)
        silent += [_uplink_only(hub.url, f"{i:032x}") for i in range(3)]
        assert until(lambda: hub._handshakes == 6)
        started = time.monotonic()
        with tensorwire.connect(hub.url, client_id="device", timeout=T):
            assert hub.wait_for(1, timeout=T) == ["device"]
        # at once: well inside the 10 s a waiting call is given before it is ended
        assert time.monotonic() - started < HANDSHAKE_TIMEOUT / 2

        def pushed() -> list:  # reported by the pushed call's own thread, once it wakes
            return [e for e in hub.events if "did not come while" in e.reason]

        assert until(lambda: len(pushed()) >= 1), hub.events
        assert len(pushed()) == 1, hub.events  # one made room; the other paired at once
        oldest = silent[0] if "silent0" in pushed()[0].reason else silent[3]
        with pytest.raises(StopIteration):
            oldest[2].read_chunk()  # the pushed call was ended
        for client, _, call in silent:
            call.cancel()
            client.close()
        assert until(lambda: hub._handshakes == 0)
