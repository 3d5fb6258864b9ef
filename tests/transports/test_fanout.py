"""``fanout="sequential"``: a broadcast reaches one client after another (FedComm's TCP
server), on every scheme; each client's time includes those before it."""

from __future__ import annotations

import numpy as np
import pytest

import tensorwire

T = 30.0


def test_a_sequential_broadcast_reaches_every_client_in_turn(scheme, scheme_module, request):
    hub = tensorwire.serve(scheme_module.hub_url(request), codec=None, fanout="sequential")
    chans = []
    try:
        assert hub.fanout == "sequential"
        for i in range(3):
            chans.append(tensorwire.connect(hub.url, client_id=f"f{i}", codec=None, timeout=T))
        hub.wait_for(3, timeout=T)
        x = np.arange(300_000, dtype=np.float32)
        out = hub.broadcast({"x": x}, timeout=T, clients=["f0", "f1", "f2"])
        assert not out.failed
        for ch in chans:
            assert np.array_equal(ch.recv(timeout=T)["x"], x)
        times = [out[c].wire_s for c in ("f0", "f1", "f2")]
        assert times == sorted(times), times  # each waited for the ones before it
    finally:
        for ch in chans:
            ch.close()
        hub.close()


def test_an_unknown_fanout_is_refused():
    with pytest.raises(ValueError, match="fanout"):
        tensorwire.serve("tcp://127.0.0.1:0", fanout="fast")
