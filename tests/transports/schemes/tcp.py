"""tcp:// under the conformance suite."""

SCHEME = "tcp"


def hub_url(request) -> str:
    """URL to serve a fresh hub on (port 0: any free port)."""
    return "tcp://127.0.0.1:0"


def inject_garbage(hub_url: str) -> None:
    """Join as client "intruder" through the raw transport, then send bytes that are no message."""
    import socket

    from tensorwire.transports.session import ClientSession
    from tensorwire.transports.url import host_port

    sock = socket.create_connection(host_port(hub_url), timeout=10)
    hello = ClientSession("intruder", decoders=[], max_message_bytes=1 << 20).hello()
    sock.sendall(hello.to_bytes())
    sock.recv(4)
    sock.sendall(b"\xde\xad\xbe\xef" * 64)
    sock.close()


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As strangers on the hub's port: junk instead of a hello, a prefix declaring an 8 MiB
    header that never comes, a hello then a header declaring a 1 GiB tensor cut short, and a
    hundred connections that say nothing. (Without credentials a hub lets anyone join under a
    fresh id; taking over ``client_ids`` is the security layer's to refuse.)"""
    import socket

    import numpy as np

    from tensorwire.transports.session import ClientSession
    from tensorwire.transports.url import host_port
    from tensorwire.wire import encode_message
    from tensorwire.wire.format import MAGIC, PREFIX, VERSION

    address = host_port(hub_url)
    socks = []
    for payload in (
        b"\xde\xad\xbe\xef" * 64,
        PREFIX.pack(MAGIC, VERSION, 0, 0, (8 << 20) - 1, 0, 1 << 40),
    ):
        s = socket.create_connection(address, timeout=10)
        s.sendall(payload)
        socks.append(s)
    s = socket.create_connection(address, timeout=10)
    s.sendall(ClientSession("stranger", decoders=[], max_message_bytes=1 << 20).hello().to_bytes())
    s.recv(1 << 16)
    big = encode_message({"x": np.zeros(1, np.float32)}, {}).to_bytes()
    s.sendall(big[: len(big) // 2])  # a message cut short, then silence
    socks.append(s)
    for _ in range(100):
        socks.append(socket.create_connection(address, timeout=10))
    for s in socks:
        s.close()


def proxy_target(hub_url: str) -> tuple[str, int]:
    """Where a recording proxy forwards a client's connection to: the hub's port."""
    from tensorwire.transports.url import host_port

    return host_port(hub_url)


def proxied_url(hub_url: str, port: int) -> str:
    """The hub's URL as reached through a proxy on 127.0.0.1:``port``."""
    return f"tcp://127.0.0.1:{port}"


def later_hub_url(request) -> str:
    """A URL a channel may dial before its hub serves on it (a port held for the test)."""
    from scheme_hooks import held_port_url

    return held_port_url(request, "tcp")
