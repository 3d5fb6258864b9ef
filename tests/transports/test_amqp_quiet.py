"""amqp:// endpoints that have nothing to do ask nothing (issue #27: 2,000 clients woke twice a
second and looked at the uplink every 2 s, 1,000 round trips a second): a consumer thread
sleeps as long as its tick says, a client looks at the uplink every HUB_CHECK seconds from a
random start, and its admin channel opens only when first used."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")

from waiting import until

import tensorwire
from tensorwire.transports.amqp import AmqpAddress
from tensorwire.transports.amqp import consumer as amqp_consumer
from tensorwire.transports.amqp.settings import HUB_CHECK, MAX_TICK, TICK

SCHEME = __import__("amqp_helpers").SCHEME
T = 60.0  # seconds: joins on a loaded 2-core machine


class _Connection:
    """Stands in for pika's: records how long each poll was allowed to wait; the first poll
    after ``lose_at`` calls is a lost connection."""

    def __init__(self, waits: list[float], lose_at: int | None = None) -> None:
        self.waits, self.lose_at, self.is_open = waits, lose_at, True

    def process_data_events(self, time_limit: float) -> None:
        self.waits.append(time_limit)
        if self.lose_at is not None and len(self.waits) == self.lose_at:
            raise OSError("connection reset")

    def add_callback_threadsafe(self, fn) -> None:
        pass

    def close(self) -> None:
        self.is_open = False


def _consumer(monkeypatch, waits: list[float], afters: list[float | None], lose_at=None):
    """A Consumer on a stand-in connection whose tick returns ``afters`` in turn."""
    conn = _Connection(waits, lose_at)
    monkeypatch.setattr(amqp_consumer, "connect_blocking", lambda *a: conn)
    monkeypatch.setattr(amqp_consumer, "dial", lambda reopen, **kw: conn)
    turns = iter(afters)
    ticked = threading.Event()

    def tick() -> float | None:
        after = next(turns, None)
        if after is None:
            ticked.set()
        return after

    consumer = amqp_consumer.Consumer(
        AmqpAddress("amqp://127.0.0.1/?prefix=p"),
        "c",
        None,
        setup=lambda conn: None,
        tick=tick,
        on_lost=lambda detail: None,
        on_back=lambda detail: None,
        on_gone=lambda exc: False,
    )
    consumer.start()
    assert ticked.wait(10)
    consumer.stop()
    return waits


def test_a_consumer_thread_sleeps_as_long_as_its_tick_says(monkeypatch):
    waits = _consumer(monkeypatch, [], [7.0, 3600.0, -1.0, None])
    assert waits[:5] == [0.0, min(7.0, MAX_TICK), MAX_TICK, 0.0, TICK]


def test_after_a_lost_connection_the_tick_is_due_at_once(monkeypatch):
    waits = _consumer(monkeypatch, [], [5.0, 5.0, None], lose_at=3)
    assert waits[:4] == [0.0, 5.0, 5.0, 0.0]  # the third poll lost it; the new one ticks now


def test_idle_clients_look_at_the_uplink_spread_out_and_open_channels_only_when_used(request):
    url = SCHEME.private_broker(request).hub_url()  # the session's private node
    with tensorwire.serve(url, codec=None) as hub:
        chans = [tensorwire.connect(hub.url, client_id=f"q{i}", timeout=T) for i in range(12)]
        try:
            hub.wait_for(len(chans), timeout=T)
            now = time.monotonic()
            looks = [ch._next_hub_check - now for ch in chans]
            assert all(-1.0 < s <= HUB_CHECK for s in looks), looks
            assert max(looks) - min(looks) > HUB_CHECK / 4, looks  # not all at once
            ch = chans[0]
            # a joined client's tick sleeps until its next look, not TICK
            assert until(lambda: ch._link._admin is not None, timeout=HUB_CHECK + T)
            assert ch._next_hub_check - time.monotonic() > TICK
        finally:
            for ch in chans:
                ch.close()


_HUB = """
import sys, time
import numpy as np
import tensorwire
hub = tensorwire.serve(sys.argv[1], codec=None)
print(hub.url, flush=True)
hub.wait_for(2, timeout=60)
for _ in range(6000):  # 300 s at most; the test kills it after a few
    hub.send("busy", {"v": np.zeros(4)}, timeout=60)
    time.sleep(0.05)
"""


def test_a_client_that_hears_from_its_hub_does_not_look_and_still_sees_it_die(request, monkeypatch):
    """A chunk from the hub in the last HUB_CHECK seconds stands for a look at the uplink (in
    a round, 2,000 clients' looks were a fifth of the broker's work); once the hub stops
    (SIGKILL: no goodbye), the looks come back and find it gone."""
    from tensorwire.errors import PeerGone
    from tensorwire.transports.amqp import channel as amqp_channel

    monkeypatch.setattr(amqp_channel, "HUB_CHECK", 1.0)
    monkeypatch.setattr(amqp_channel, "HUB_GRACE", 1.0)
    url = SCHEME.private_broker(request).hub_url()
    hub = subprocess.Popen([sys.executable, "-c", _HUB, url], stdout=subprocess.PIPE, text=True)
    chans = []
    try:
        assert hub.stdout is not None
        client_url = hub.stdout.readline().strip()
        assert client_url, "the hub's process printed no URL"
        looks = {"busy": 0, "idle": 0}
        for cid in looks:
            ch = tensorwire.connect(client_url, client_id=cid, codec=None, timeout=T)
            chans.append(ch)

            def counted(ch=ch, look=ch._check_hub) -> None:
                looks[ch.client_id] += 1
                look()

            ch._check_hub = counted
        busy, _ = chans
        assert busy.recv(timeout=T).n_tensors == 1  # the hub is sending (every 50 ms) now
        looks["busy"] = 0  # before, it may have looked while the other client joined
        idle_before = looks["idle"]
        assert until(lambda: looks["idle"] >= idle_before + 6, timeout=T)
        # the old code looks as often as the idle client; a hub stalled for a second on a
        # loaded machine may cost one look
        assert looks["busy"] <= 2, looks
        hub.kill()
        hub.wait(timeout=T)
        with pytest.raises(PeerGone, match="nobody consumed"):
            for _ in range(5000):  # what the hub sent, then the news that it is gone
                busy.recv(timeout=T)
        assert looks["busy"] >= 2
    finally:
        hub.kill()
        hub.wait(timeout=T)
        for ch in chans:
            ch.close()
