"""A hub's I/O thread does work for the peers that sent or are due something, never for
every peer on every turn: with many idle peers joined, one busy peer's traffic costs the
idle ones nothing. (Each turn looking at every connection made a quic hub's gather of N
clients cost O(N^2): 273 ms per client at 500; a udp hub's broadcast too.)"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

import tensorwire

T = 60.0
IDLE = 24  # idle peers beside the busy one
MESSAGES = 20
PAYLOAD = np.arange(16 << 10, dtype=np.float32)  # 64 KiB: dozens of datagrams each


class Calls:
    """Counts the calls of one bound method, replaced on its instance."""

    def __init__(self, owner: object, name: str) -> None:
        self.n = 0
        self._lock = threading.Lock()
        inner = getattr(owner, name)

        def counted(*args, **kwargs):
            with self._lock:
                self.n += 1
            return inner(*args, **kwargs)

        setattr(owner, name, counted)


def _busy_round(hub, busy) -> None:
    for i in range(MESSAGES):
        busy.send({"x": PAYLOAD}, meta={"i": i}, timeout=T)
    for _ in range(MESSAGES):
        assert hub.recv(timeout=T)[0] == "busy"


@contextlib.contextmanager
def _joined(url: str):
    with tensorwire.serve(url, codec=None) as hub, contextlib.ExitStack() as stack:
        for i in range(IDLE):
            stack.enter_context(tensorwire.connect(hub.url, client_id=f"idle-{i}", timeout=T))
        busy = stack.enter_context(tensorwire.connect(hub.url, client_id="busy", timeout=T))
        hub.wait_for(IDLE + 1, timeout=T)
        yield hub, busy


def test_a_quic_hub_builds_no_packets_for_idle_connections_while_one_is_busy():
    pytest.importorskip("aioquic", reason="quic needs aioquic (extra tensorwire[quic])")
    with _joined("quic://127.0.0.1:0?idle=600") as (hub, busy):  # no keep-alive in the test
        calls = {cid: Calls(c.conn, "datagrams_to_send") for cid, c in hub._peers.items()}
        _busy_round(hub, busy)
        idle = [calls[f"idle-{i}"].n for i in range(IDLE)]
        # an idle one at most for a late acknowledgement of its join (before: every turn,
        # as often as the busy one)
        assert max(idle) <= 2, (idle, calls["busy"].n)
        # the counting works: the busy one was served, in as few turns as a loaded hub batches
        assert calls["busy"].n > max(2, *idle), (idle, calls["busy"].n)


def test_a_udp_hub_ticks_no_idle_flow_while_one_is_busy():
    with _joined("udp://127.0.0.1:0") as (hub, busy):
        with hub._lock:
            flows = dict(hub._flows)
        calls = {cid: Calls(flow, "tick") for cid, flow in flows.items()}
        _busy_round(hub, busy)
        idle = [calls[f"idle-{i}"].n for i in range(IDLE)]
        assert max(idle) == 0, (idle, calls["busy"].n)  # before: every turn, every flow
        assert calls["busy"].n >= 1  # the counting works: the busy one was ticked
