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
