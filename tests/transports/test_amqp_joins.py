"""amqp:// joins at scale (issue #27): the hellos the hub reads together have their queues
bound in one round trip to the broker and are welcomed without waiting for confirms; a batch
with a queue that vanished still binds the others."""

from __future__ import annotations

import threading
import uuid

import pytest

pika = pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")

from amqp_helpers import (  # noqa: E402
    T,
    fixture_broker,  # noqa: F401  (a fixture: broker)
    fixture_url,  # noqa: F401  (a fixture: url)
)
from waiting import until  # noqa: E402

import tensorwire  # noqa: E402
from tensorwire.transports.amqp.connection import Admin  # noqa: E402
from tensorwire.transports.amqp.publisher import Publisher  # noqa: E402


def test_hellos_read_together_are_bound_in_one_round_trip(url, monkeypatch):
    """The hub's thread is held while five clients say hello: once free, it reads them
    together and binds their queues with one round trip (it used to bind, then wait for a
    confirmed welcome, hello by hello: 2,000 clients took 24 s to join)."""
    batches: list[list[str]] = []
    bind_all = Admin.bind_all

    def counted(self, queues, exchange):
        batches.append(list(queues))
        return bind_all(self, queues, exchange)

    monkeypatch.setattr(Admin, "bind_all", counted)
    hellos: list[str] = []
    publish = Publisher.publish

    def said(self, exchange, routing_key, enc, *args, **kwargs):
        publish(self, exchange, routing_key, enc, *args, **kwargs)
        if routing_key.endswith(".up"):  # a hello, while they join: the broker has it
            hellos.append(routing_key)

    monkeypatch.setattr(Publisher, "publish", said)
    n = 5
    with tensorwire.serve(url, codec=None) as hub:
        held, release = threading.Event(), threading.Event()

        def hold(_conn) -> None:
            held.set()
            release.wait(T)

        holder = threading.Thread(target=hub._consumer.call, args=(hold, None), daemon=True)
        holder.start()
        assert held.wait(T)
        chans: list = []

        def join(i: int) -> None:
            chans.append(tensorwire.connect(hub.url, client_id=f"j{i}", codec=None, timeout=T))

        joiners = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(n)]
        try:
            for t in joiners:
                t.start()
            assert until(lambda: len(hellos) >= n, T)
            release.set()
            for t in joiners:
                t.join(T)
            assert len(chans) == n
            assert hub.wait_for(n, timeout=T) == sorted(f"j{i}" for i in range(n))
            assert sum(len(b) for b in batches) >= n
            assert max(len(b) for b in batches) > 1, batches  # some read together
            sent = hub.broadcast(meta={"to": "all"}, timeout=T)  # the queues are bound
            assert len(sent) == n and not sent.failed
            for ch in chans:
                assert ch.recv(timeout=T).meta == {"to": "all"}
        finally:
            release.set()
            for ch in chans:
                ch.close()


def test_a_batch_of_binds_with_a_vanished_queue_binds_the_others(broker):
    conn = pika.BlockingConnection(pika.URLParameters(broker))
    prefix = f"twtest-{uuid.uuid4().hex[:12]}"
    exchange = f"{prefix}.all"
    try:
        ch = conn.channel()
        ch.exchange_declare(exchange, "fanout", auto_delete=True)
        queues = [f"{prefix}.c.q{i}" for i in range(3)]
        for queue in (queues[0], queues[2]):  # queues[1] is gone
            ch.queue_declare(queue, exclusive=True)
        admin = Admin(conn)
        assert admin.bind_all(queues, exchange) == [True, False, True]
        ch.basic_publish(exchange, "", b"to both")
        for queue in (queues[0], queues[2]):
            assert until(
                lambda q=queue: ch.queue_declare(q, passive=True).method.message_count == 1, T
            )
        assert admin.bind_all(queues[:1], exchange) == [True]  # a new channel after the refusal
    finally:
        if conn.is_open:
            conn.channel().exchange_delete(exchange)
            conn.close()
