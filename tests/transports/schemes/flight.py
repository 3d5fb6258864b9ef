"""flight:// under the conformance suite."""

from __future__ import annotations

SCHEME = "flight"


def hub_url(request) -> str:
    """URL to serve a fresh hub on (port 0: any free port)."""
    return "flight://127.0.0.1:0"


def _hello(client_id: str):
    """A valid hello (a fresh session id) as a ``ClientSession`` would say it."""
    from tensorwire.transports.session import ClientSession

    return ClientSession(client_id, decoders=[], max_message_bytes=1 << 20)


def _raw_batch(data: bytes):
    """``data`` as the one value of a record batch of the hub's schema."""
    import pyarrow as pa

    from tensorwire.transports.flight import SCHEMA

    offsets = pa.py_buffer((0).to_bytes(4, "little") + len(data).to_bytes(4, "little"))
    column = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(data)])
    return pa.RecordBatch.from_arrays([column], schema=SCHEMA)


def _open(client, command: bytes):
    """A downlink call whose descriptor carries ``command`` (a hello, or whatever), as
    ``(writer, reader)``. Keep the writer until the call is cancelled: closing it (which
    dropping it does) waits for the hub to end the call."""
    import pyarrow.flight as flight

    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(command))
    writer.done_writing()
    return writer, reader


def _uplink(client, session: str):
    import contextlib

    import pyarrow.flight as flight

    from tensorwire.transports.flight.options import FLIGHT_ERRORS, SCHEMA, UP

    writer, reader = client.do_exchange(flight.FlightDescriptor.for_path(*UP, session))
    with contextlib.suppress(FLIGHT_ERRORS):  # refused at once: writes say so
        writer.begin(SCHEMA)
    return writer, reader


def _hang_up(client, calls) -> None:
    """Cancel every ``(writer, reader)`` call, so the hub's ends of them end at once, then
    close the client."""
    import contextlib

    from tensorwire.transports.flight import FLIGHT_ERRORS

    for _, reader in calls:
        reader.cancel()
    for writer, _ in calls:
        with contextlib.suppress(FLIGHT_ERRORS):  # cancelled: says so
            writer.close()
    with contextlib.suppress(FLIGHT_ERRORS):
        client.close()


def inject_garbage(hub_url: str) -> None:
    """Open a session as client "intruder" with raw Flight calls, then send a batch of junk."""
    import pyarrow.flight as flight

    from tensorwire.transports.flight import FLIGHT_ERRORS
    from tensorwire.transports.url import host_port

    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(hub_url)))
    session = _hello("intruder")
    down = _open(client, session.hello().to_bytes())
    up = _uplink(client, session.session)
    down[1].read_chunk()  # the welcome
    up[0].write_batch(_raw_batch(b"\xde\xad\xbe\xef" * 64))
    try:
        while True:  # until the hub says bye and ends the downlink
            down[1].read_chunk()
    except (StopIteration, *FLIGHT_ERRORS):
        pass
    _hang_up(client, [down, up])


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As strangers on the hub's port, through Flight calls: downlinks whose hello is junk,
    declares an 8 MiB header or a 1 TiB body, or is refused; sessions (under fresh ids) that
    send junk and data in app_metadata, a message whose header declares 8 MiB that never
    comes, a header declaring a 1 GiB tensor cut short, and a junk batch; uplinks naming
    sessions nobody opened; and a hundred downlinks that never open their uplink. (Without
    credentials a hub lets anyone join under a fresh id; taking over ``client_ids`` is the
    security layer's to refuse.)"""
    import time
    import uuid

    import numpy as np
    import pyarrow.flight as flight

    from tensorwire.transports.flight.options import FLIGHT_ERRORS
    from tensorwire.transports.url import host_port
    from tensorwire.wire import encode_message
    from tensorwire.wire.format import MAGIC, PREFIX, VERSION

    location = flight.Location.for_grpc_tcp(*host_port(hub_url))
    client = flight.FlightClient(location)
    calls = []
    tag = uuid.uuid4().hex[:8]
    huge_body = PREFIX.pack(MAGIC, VERSION, 0, 0, (8 << 20) - 1, 0, 1 << 40)
    wrong_id = encode_message(None, {"client_id": "", "version": 2, "session": "x"}, kind="hello")
    for command in (b"\xde\xad\xbe\xef" * 64, huge_body, wrong_id.to_bytes()):
        calls.append(_open(client, command))
    big = encode_message({"x": np.zeros(1 << 28, np.float32)}, {}).head  # declares 1 GiB
    payloads = {
        "app-metadata": None,
        "huge-body": huge_body,
        "huge-header": PREFIX.pack(MAGIC, VERSION, 0, 0, (8 << 20) - 1, 0, 0),
        "cut-short": bytes(big),
        "junk": b"\xde\xad\xbe\xef" * 64,
    }
    for name, payload in payloads.items():
        session = _hello(f"stranger-{tag}-{name}")
        down = _open(client, session.hello().to_bytes())
        up = _uplink(client, session.session)
        calls += [down, up]
        try:  # refused (too many handshakes, say), or ended by the hub: on to the next
            down[1].read_chunk()  # the schema and welcome
            if payload is None:
                up[0].write_metadata(b"\xde\xad\xbe\xef" * 64)
                up[0].write_metadata(encode_message({"v": np.arange(3)}).to_bytes())
            else:
                up[0].write_batch(_raw_batch(payload))
        except (StopIteration, *FLIGHT_ERRORS):
            pass
    for _ in range(10):
        calls.append(_uplink(client, uuid.uuid4().hex))
    for i in range(100):
        calls.append(_open(client, _hello(f"silent-{tag}-{i}").hello().to_bytes()))
    _hang_up(client, calls)
    time.sleep(0.5)  # the hub frees their handshake slots as they hang up, for the next stranger


def proxy_target(hub_url: str) -> tuple[str, int]:
    """Where a recording proxy forwards a client's connection to: the hub's gRPC port."""
    from tensorwire.transports.url import host_port

    return host_port(hub_url)


def proxied_url(hub_url: str, port: int) -> str:
    """The hub's URL as reached through a proxy on 127.0.0.1:``port`` (the hub's certificate
    carries 127.0.0.1, so TLS verifies through it)."""
    return f"flight://127.0.0.1:{port}"


def later_hub_url(request) -> str:
    """A URL a channel may dial before its hub serves on it (a port held for the test)."""
    from scheme_hooks import held_port_url

    return held_port_url(request, "flight")
