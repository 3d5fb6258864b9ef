"""ucx:// under the conformance suite.

Security takes the default hooks (mutual TLS settings, which ucx:// accepts and does not use,
and the device keys, which admit clients and seal the traffic); there is no ``proxied_url``:
UCX's connection manager opens connections of its own that a TCP proxy cannot stand between,
so the capture test skips (tests/transports/test_ucx.py checks the sealing instead)."""

from __future__ import annotations

import contextlib
import time

import pytest

SCHEME = "ucx"
T = 10.0  # seconds a raw endpoint waits for the hub


def hub_url(request) -> str:
    """URL to serve a fresh hub on (port 0: any free port)."""
    pytest.importorskip("ucxx", reason="ucxx is not installed (extra 'ucx')")
    return "ucx://127.0.0.1:0"


_WORKER: list = []  # one raw worker for every stranger of the test run


def _endpoint(hub_url: str):
    """A raw UCX endpoint to the hub."""
    from tensorwire.transports.ucx.settings import UcxSettings
    from tensorwire.transports.ucx.workers import start_worker, ucx_api
    from tensorwire.transports.url import host_port

    if not _WORKER:
        _WORKER.append(start_worker(UcxSettings.from_url(hub_url)))
    host, port = host_port(hub_url)
    return ucx_api().UCXEndpoint.create(_WORKER[0], host, port, True)


def _pipe(hub_url: str):
    from tensorwire.transports.ucx.pipe import UcxPipe
    from tensorwire.wire import Limits

    return UcxPipe(_endpoint(hub_url), Limits())


def _send(endpoint, data: bytes) -> None:
    """Send ``data``, waiting (bounded) until it went or the hub dropped the connection."""
    from tensorwire.errors import TransportError
    from tensorwire.transports.ucx.workers import array, wait

    with contextlib.suppress(TransportError):  # the hub refused this connection already
        wait(endpoint.stream_send(array(data)), time.monotonic() + T, "send")


def _join(hub_url: str, client_id: str):
    """A raw endpoint that said a valid hello and got the hub's welcome."""
    from tensorwire.transports.session import ClientSession

    pipe = _pipe(hub_url)
    pipe.send(ClientSession(client_id, decoders=[], max_message_bytes=1 << 20).hello(), None)
    assert pipe.read_message(time.monotonic() + T).kind == "welcome"
    return pipe


def inject_garbage(hub_url: str) -> None:
    """Join as client "intruder" through a raw UCX endpoint, then send bytes that are no
    message."""
    pipe = _join(hub_url, "intruder")
    _send(pipe.endpoint, b"\xde\xad\xbe\xef" * 64)
    time.sleep(0.2)  # let it arrive before the endpoint closes
    pipe.close()


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As strangers through raw UCX endpoints: junk instead of a hello, a prefix declaring an
    8 MiB header and a 1 TiB body, a hello then a header declaring a 1 GiB tensor cut short,
    and a hundred connections that say nothing. (Without credentials a hub lets anyone join
    under a fresh id; taking over ``client_ids`` is the security layer's to refuse.)"""
    import numpy as np

    from tensorwire.wire import encode_message
    from tensorwire.wire.format import MAGIC, PREFIX, VERSION

    pipes = []
    for payload in (
        b"\xde\xad\xbe\xef" * 64,
        PREFIX.pack(MAGIC, VERSION, 0, 0, (8 << 20) - 1, 0, 1 << 40),
    ):
        pipe = _pipe(hub_url)
        _send(pipe.endpoint, payload)
        pipes.append(pipe)
    member = _join(hub_url, "stranger")
    cut_short = encode_message({"x": np.zeros(1 << 28, np.float32)}, {}).head  # 1 GiB declared
    _send(member.endpoint, bytes(cut_short) + bytes(4096))  # then silence
    pipes += [_pipe(hub_url) for _ in range(100)]
    time.sleep(0.5)
    for pipe in [member, *pipes]:
        pipe.close()  # (a raw close() of an endpoint the hub dropped crashes: see UcxPipe)
