"""zmq+tcp:// under the conformance suite."""

import pytest

SCHEME = "zmq+tcp"


def hub_url(request) -> str:
    """URL to serve a fresh hub on (port 0: any free port)."""
    pytest.importorskip("zmq", reason="pyzmq is not installed (extra 'zmq')")
    return "zmq+tcp://127.0.0.1:0"


def inject_garbage(hub_url: str, after_hello: bool = True) -> None:
    """Send the hub ZeroMQ messages that are no tensorwire message, from a raw DEALER socket
    (as client "intruder" after a valid hello, or anonymous): one without the segment
    marker, one with the marker and junk after it."""
    import zmq

    from tensorwire.wire import encode_message

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 5000
    if after_hello:
        sock.identity = b"intruder"
    sock.connect(hub_url.removeprefix("zmq+"))
    try:
        if after_hello:
            hello = encode_message(None, {"client_id": "intruder", "decoders": []}, kind="hello")
            sock.send_multipart([b"S", hello.to_bytes()])
            assert sock.poll(10_000), "the hub did not answer the hello"
            sock.recv_multipart()
        sock.send_multipart([b"\xde\xad\xbe\xef" * 64])
        sock.send_multipart([b"S", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64)])
    finally:
        sock.close()
        ctx.term()
