"""zmq+tcp:// under the conformance suite."""

import pytest

SCHEME = "zmq+tcp"
T_MS = 10_000  # milliseconds a raw socket waits for the hub's answer


def hub_url(request) -> str:
    """URL to serve a fresh hub on (port 0: any free port)."""
    pytest.importorskip("zmq", reason="pyzmq is not installed (extra 'zmq')")
    return "zmq+tcp://127.0.0.1:0"


def _dealer(ctx, hub_url: str, routing_id: bytes | None = None):
    import zmq

    sock = ctx.socket(zmq.DEALER)
    sock.linger = 5000
    if routing_id is not None:
        sock.routing_id = routing_id
    sock.connect(hub_url.removeprefix("zmq+"))
    return sock


def _say_hello(sock, client_id: str, session: str | None = None) -> str:
    """Send a valid hello (its session is the socket's routing id unless ``session`` is
    given); return the kind of the hub's answer."""
    from tensorwire.transports.session import ClientSession
    from tensorwire.wire import decode_message

    hello = ClientSession(client_id, decoders=[], max_message_bytes=1 << 20)
    hello.session = session or sock.routing_id.decode()
    sock.send_multipart([b"S", hello.hello().to_bytes()])
    assert sock.poll(T_MS), "the hub did not answer the hello"
    frames = sock.recv_multipart()
    return decode_message(b"".join([frames[0][1:], *frames[1:]])).kind


def inject_garbage(hub_url: str, after_hello: bool = True) -> None:
    """Send the hub ZeroMQ messages that are no tensorwire message, from a raw DEALER socket
    (as client "intruder" after a valid hello, or anonymous): one without the segment
    marker, one with the marker and junk after it."""
    import uuid

    import zmq

    ctx = zmq.Context()
    sock = _dealer(ctx, hub_url, uuid.uuid4().hex.encode() if after_hello else None)
    try:
        if after_hello:
            assert _say_hello(sock, "intruder") == "welcome"
        sock.send_multipart([b"\xde\xad\xbe\xef" * 64])
        sock.send_multipart([b"S", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64)])
    finally:
        sock.close()
        ctx.term()


def _huge_declared(n_bytes: int) -> bytes:
    """The start of a data message whose header declares one float32 tensor of ``n_bytes``:
    prefix, header and 4 KiB of the body."""
    from tensorwire.wire.format import build_header, pack_prefix

    entry = {
        "name": ["x"],
        "dtype": "float32",
        "shape": [n_bytes // 4],
        "order": "C",
        "nbytes": n_bytes,
        "size": n_bytes,
    }
    header = build_header("data", {}, None, [entry])
    return pack_prefix(header, n_bytes, digests=False) + header + bytes(4096)


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As strangers on the hub's port, from raw DEALER sockets: junk instead of a hello, a
    prefix declaring an 8 MiB header and a 1 TiB body, a hello then a header declaring a 1 GiB
    tensor cut short, data and hellos from impostors whose routing id is a client's id (the
    routing ids of the old protocol), and a hundred connections that say nothing.

    The impostors must get nothing but a refusal or a bye. (Without credentials a hub lets
    anyone join under a fresh session; taking over ``client_ids`` by a valid hello of their
    own is the security layer's to refuse.)"""
    import uuid

    import numpy as np
    import zmq

    from tensorwire.wire import decode_message, encode_message
    from tensorwire.wire.format import MAGIC, PREFIX, VERSION

    ctx = zmq.Context()
    socks = []
    try:
        for frames in (
            [b"\xde\xad\xbe\xef" * 64],
            [b"S" + PREFIX.pack(MAGIC, VERSION, 0, 0, (8 << 20) - 1, 0, 1 << 40)],
            [b"C" + bytes(1 << 16)],  # the rest of a message never started
        ):
            s = _dealer(ctx, hub_url)
            s.send_multipart(frames)
            socks.append(s)
        member = _dealer(ctx, hub_url, uuid.uuid4().hex.encode())
        assert _say_hello(member, "stranger") == "welcome"
        member.send_multipart([b"S" + _huge_declared(1 << 30)])  # then silence
        socks.append(member)
        data = encode_message({"x": np.zeros(4, np.float32)}, {"forged": True}).to_bytes()
        impostors = []
        for cid in client_ids:
            s = _dealer(ctx, hub_url, cid.encode())
            assert _say_hello(s, cid, session=uuid.uuid4().hex) == "refuse"
            s.send_multipart([b"S" + data])  # no session: the hub answers bye
            impostors.append(s)
        for _ in range(100):
            socks.append(_dealer(ctx, hub_url))
        for s in impostors:
            while s.poll(200):
                frames = s.recv_multipart()
                kind = decode_message(b"".join([frames[0][1:], *frames[1:]])).kind
                assert kind in ("bye", "refuse"), f"an impostor got a {kind!r} message"
        socks += impostors
    finally:
        for s in socks:
            s.close(linger=0)
        ctx.term()


def hub_security(enrolment) -> dict:
    """CURVE (the key pair in ``hub.curve`` beside the hub's certificate) and enrolled keys:
    ZeroMQ has no X.509, so a hub here checks no client certificate (``ca=`` is refused
    without keys)."""
    import tensorwire

    return {
        "tls": tensorwire.TLS(cert=enrolment.hub_cert, key=enrolment.hub_key),
        "auth": tensorwire.Keys.load(enrolment.keys),
    }


def client_security(enrolment, client_id: str) -> dict:
    """CURVE to the hub's public key (``hub.curve.pub`` beside the CA) and the device's
    secret; a fresh CURVE key pair per connection."""
    import tensorwire

    return {
        "tls": tensorwire.TLS(ca=enrolment.ca),
        "key": enrolment.devices[client_id]["secret"],
    }


def proxy_target(hub_url: str) -> tuple[str, int]:
    """Where a recording proxy forwards a client's connection to: the hub's port."""
    from tensorwire.transports.url import host_port

    return host_port(hub_url)


def proxied_url(hub_url: str, port: int) -> str:
    """The hub's URL as reached through a proxy on 127.0.0.1:``port``."""
    return f"zmq+tcp://127.0.0.1:{port}"


def later_hub_url(request) -> str:
    """A URL a channel may dial before its hub serves on it (a port held for the test)."""
    from scheme_hooks import held_port_url

    return held_port_url(request, "zmq+tcp")
