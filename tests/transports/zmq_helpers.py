"""What the zmq+tcp:// test files share: the generous timeout, a hub on loopback, and a ZeroMQ
context for raw sockets. Import it after ``pytest.importorskip("zmq")``."""

from __future__ import annotations

import pytest
import zmq

import tensorwire

T = 20.0


@pytest.fixture(name="hub")
def fixture_hub():
    with tensorwire.serve("zmq+tcp://127.0.0.1:0") as h:
        yield h


@pytest.fixture(name="ctx")
def fixture_ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)
