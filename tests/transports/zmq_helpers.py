"""What the zmq+tcp:// test files share: the generous timeout, a hub on loopback, a ZeroMQ
context for raw sockets, and a fake hub's welcome. Import it after
``pytest.importorskip("zmq")``."""

from __future__ import annotations

import pytest
import zmq

import tensorwire
from tensorwire.transports.session import HubSession
from tensorwire.transports.zmq.pieces import START
from tensorwire.wire import decode_message

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


def fake_welcome(fake: zmq.Socket) -> None:
    """Answer the first hello on the ROUTER ``fake`` as a hub would."""
    assert fake.poll(T * 1000)
    ident, *frames = fake.recv_multipart()
    session = HubSession(decoders=[], max_message_bytes=1 << 30)
    session.receive(decode_message(b"".join([frames[0][1:], *frames[1:]])))
    fake.send_multipart([ident, START, session.welcome().to_bytes()])
