"""udp:// (reliable mode) under the conformance suite."""

SCHEME = "udp"

# Loopback carries 64 KiB datagrams: big chunks keep the 1 GiB message to ~16k datagrams.
LOOPBACK_MTU = 65000


def hub_url(request) -> str:
    """URL to serve a fresh hub on (port 0: any free port)."""
    return f"udp://127.0.0.1:0?mode=reliable&mtu={LOOPBACK_MTU}"


def inject_garbage(hub_url: str) -> None:
    """Send junk datagrams to the hub's UDP port, then junk on a control connection."""
    import socket

    from tensorwire.transports.url import host_port

    address = host_port(hub_url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"\xde\xad\xbe\xef" * 64, address)
        udp.sendto(b"TWCK" + b"\0" * 10, address)
    with socket.create_connection(address, timeout=10) as control:
        control.sendall(b"\xde\xad\xbe\xef" * 64)
