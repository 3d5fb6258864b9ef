"""flight:// under the conformance suite."""

SCHEME = "flight"


def hub_url(request) -> str:
    """URL to serve a fresh hub on (port 0: any free port)."""
    return "flight://127.0.0.1:0"


def inject_garbage(hub_url: str) -> None:
    """Open a session as client "intruder" with raw Flight calls, then send a batch of junk."""
    import contextlib

    import pyarrow as pa
    import pyarrow.flight as flight

    from tensorwire.transports.url import host_port
    from tensorwire.wire import encode_message

    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(hub_url)))
    down_writer, down = client.do_exchange(flight.FlightDescriptor.for_path("tensorwire", "down"))
    hello = {"client_id": "intruder", "decoders": [], "session": "s1"}
    down_writer.write_metadata(encode_message(None, hello, kind="hello").to_bytes())
    down_writer.done_writing()
    up, _ = client.do_exchange(flight.FlightDescriptor.for_path("tensorwire", "up", "s1"))
    up.begin(pa.schema([("bytes", pa.binary())]))
    down.read_chunk()  # the welcome
    junk = b"\xde\xad\xbe\xef" * 64
    offsets = pa.py_buffer((0).to_bytes(4, "little") + len(junk).to_bytes(4, "little"))
    column = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(junk)])
    up.write_batch(pa.record_batch([column], names=["bytes"]))
    try:
        while True:  # until the hub says bye and ends the downlink
            down.read_chunk()
    except (StopIteration, pa.ArrowException):
        pass
    for closable in (up, down_writer, client):
        with contextlib.suppress(pa.ArrowException):  # the hub ended the calls first
            closable.close()
