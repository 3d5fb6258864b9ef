"""amqp:// at scale: one broker connection per device, a private broker sized for the devices,
and a broker that is full refusing the devices past its limit by name (BrokerFull) while it
keeps running, its hub having warned before."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")

from broker_limits import near_limit_warning, running

import tensorwire
from tensorwire.errors import BrokerFull
from tensorwire.transports.amqp import AmqpAddress
from tensorwire.transports.brokers.rabbitmq import RabbitMQBroker, rabbitmq_answers

T = 120.0  # seconds: a join on a loaded 2-core machine


def test_a_private_broker_url_names_its_connection_limit():
    node = RabbitMQBroker(fds=1024)
    assert AmqpAddress(node.url("p")).connection_max == node.limits.connections
    assert "connection_max" not in node.plain_url()  # a plain URL stays pika's


@pytest.fixture(scope="module")
def full_broker():
    """A private RabbitMQ with 1,024 descriptors (never the machine's own)."""
    yield from running(RabbitMQBroker(fds=1024, startup_timeout=180))


def test_devices_past_a_full_broker_get_BrokerFull_the_hub_warned_and_the_broker_runs_on(
    full_broker,
):
    limit = full_broker.limits.connections
    assert limit < 1024 // 2  # what 1,024 descriptors leave room for
    fit = limit - 1  # the hub holds one connection; each device exactly one
    extra = 3
    with tensorwire.serve(full_broker.url("full"), codec=None) as hub:
        assert hub.connection_max == limit

        def join(i: int):
            try:
                return tensorwire.connect(hub.url, client_id=f"d{i}", codec=None, timeout=T)
            except BrokerFull as exc:
                return exc

        with ThreadPoolExecutor(16) as pool:
            joined = list(pool.map(join, range(fit)))
        try:
            refused = [e for e in joined if isinstance(e, Exception)]
            assert not refused, refused[:3]  # one connection each: all of them fit
            hub.wait_for(fit, timeout=T)
            assert f"lets in {limit} connections" in near_limit_warning(hub, T)
            for i in range(extra):  # the devices past the limit: a clear, typed refusal
                t = time.monotonic()
                with pytest.raises(BrokerFull, match=rf"connection limit \({limit} connections\)"):
                    tensorwire.connect(hub.url, client_id=f"x{i}", codec=None, timeout=T)
                assert time.monotonic() - t < T / 2  # refused, not timed out
            assert full_broker._proc is not None and full_broker._proc.poll() is None
            sent = hub.broadcast(meta={"still": "serving"}, timeout=T)
            assert len(sent) == fit and not sent.failed
            for ch in joined[:3]:
                assert ch.recv(timeout=T).meta == {"still": "serving"}
            joined.pop().close()  # one leaves: another fits again
            with tensorwire.connect(hub.url, client_id="late", codec=None, timeout=T) as late:
                hub.wait_for(fit, timeout=T)
                assert "late" in hub.clients
                late.send(meta={"hello": 1}, timeout=T)
                who, msg = hub.recv(timeout=T)
                assert who == "late" and msg.meta == {"hello": 1}
        finally:
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda ch: ch.close(), joined))
    assert rabbitmq_answers(full_broker.plain_url(), timeout=30)


def test_a_hub_callback_sends_on_the_one_connection_without_waiting_for_itself(full_broker):
    """on_join runs on the thread of the hub's connection: a send to one and a broadcast to
    some from there publish at once (a worker thread would wait for that thread forever)."""
    greeted: list[str] = []
    hub_box: list = []

    def on_join(cid: str) -> None:
        hub = hub_box[0]
        hub.send(cid, meta={"hi": cid}, timeout=T)
        if cid == "b":
            sent = hub.broadcast(meta={"both": 1}, clients=["a", "b"], timeout=T)
            assert sorted(sent) == ["a", "b"]
        greeted.append(cid)

    with tensorwire.serve(full_broker.url("callbacks"), codec=None, on_join=on_join) as hub:
        hub_box.append(hub)
        with (
            tensorwire.connect(hub.url, client_id="z", codec=None, timeout=T) as z,
            tensorwire.connect(hub.url, client_id="a", codec=None, timeout=T) as a,
        ):
            assert z.recv(timeout=T).meta == {"hi": "z"}  # z makes [a, b] a subset: unicasts
            assert a.recv(timeout=T).meta == {"hi": "a"}
            with tensorwire.connect(hub.url, client_id="b", codec=None, timeout=T) as b:
                assert b.recv(timeout=T).meta == {"hi": "b"}
                assert a.recv(timeout=T).meta == {"both": 1}
                assert b.recv(timeout=T).meta == {"both": 1}
                assert greeted == ["z", "a", "b"]


def test_liveness_looks_at_a_bounded_number_of_members_per_check_and_still_notices_a_drop(
    full_broker, monkeypatch
):
    from tensorwire.transports.amqp import hub as amqp_hub

    monkeypatch.setattr(amqp_hub, "LIVENESS_PROBES", 1)
    reasons: list[str] = []
    looks: list[float] = []
    with tensorwire.serve(
        full_broker.url("liveness"), codec=None, on_leave=lambda cid, why: reasons.append(why)
    ) as hub:
        chans = [
            tensorwire.connect(hub.url, client_id=f"m{i}", codec=None, timeout=T) for i in range(3)
        ]
        try:
            hub.wait_for(3, timeout=T)
            consumers = hub._admin.consumers

            def counted(queue: str) -> int:
                looks.append(time.monotonic())
                return consumers(queue)

            hub._admin.consumers = counted
            chans[1]._drop()  # its connection is gone, without a goodbye
            deadline = time.monotonic() + T
            while "m1" in hub.clients and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "m1" not in hub.clients and "dropped" in reasons[0]
            assert sorted(hub.clients) == ["m0", "m2"]
            checks = (looks[-1] - looks[0]) / hub._liveness + 1  # each check's looks: 1 or 2
            assert len(looks) <= 2 * checks + 2
        finally:
            for ch in chans:
                ch.close()
