"""A hub that cannot listen where it was asked says so in one line, with what to do (issue
#30): a port in use, an address this machine does not have."""

from __future__ import annotations

import socket

import pytest

import tensorwire
from tensorwire.errors import TransportError

SCHEMES = ["tcp", "zmq+tcp", "udp", "flight"]  # each listens on a TCP port of its URL


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_port_in_use_is_one_line_that_says_what_to_do(scheme):
    with socket.create_server(("127.0.0.1", 0)) as held:  # held open: the port is in use
        port = held.getsockname()[1]
        url = f"{scheme}://127.0.0.1:{port}"
        with pytest.raises(TransportError) as caught:
            tensorwire.serve(url)
    said = str(caught.value)
    assert said.startswith(f"cannot serve {url}") and "\n" not in said
    assert "the port is in use" in said and "or 0 for any free one" in said


def test_an_address_this_machine_lacks_is_named():
    with pytest.raises(TransportError, match="this machine has no such address"):
        tensorwire.serve("tcp://192.0.2.1:0")  # TEST-NET-1: never a local address
