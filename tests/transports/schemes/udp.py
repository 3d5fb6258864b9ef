"""udp:// (reliable mode) under the conformance suite."""

SCHEME = "udp"

# Loopback carries 64 KiB datagrams: big chunks keep the 1 GiB message to ~16k datagrams.
LOOPBACK_MTU = 65000
PAYLOAD = LOOPBACK_MTU - 40  # message bytes per datagram (less the chunk header)


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


def _chunk(mid: int, index: int, count: int, offset: int, total: int, payload: bytes) -> bytes:
    from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC, CHUNK_VERSION

    head = CHUNK_HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, 0, 0, mid, index, count, offset, total)
    return head + payload


def forged_datagrams() -> list[bytes]:
    """Junk and chunks that lie: 16 GiB and 1 TiB totals, a count that does not fit the
    total, an index past the count, an offset past the end, a bad version, junk in place of a
    message. A fresh message id each call, so none is taken for a late copy of another."""
    import random

    from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC

    def mid() -> int:
        return random.getrandbits(64)

    huge = 16 << 30
    return [
        b"\xde\xad\xbe\xef" * 64,
        b"TWCK" + b"\0" * 10,
        _chunk(mid(), 0, -(-huge // PAYLOAD), 0, huge, b"\0" * PAYLOAD),
        _chunk(mid(), 3, -(-huge // PAYLOAD), 3 * PAYLOAD, huge, b"\1" * PAYLOAD),
        _chunk(mid(), 5, 2**32 - 1, 5 * PAYLOAD, huge, b"\1" * PAYLOAD),
        _chunk(mid(), 0, 1, 0, 1 << 40, b""),
        _chunk(mid(), 7, 3, 7 * PAYLOAD, 3 * PAYLOAD, b"\2" * 10),
        _chunk(mid(), 1, 2, 1 << 62, 2 * PAYLOAD, b"\3" * PAYLOAD),
        CHUNK_HEADER.pack(CHUNK_MAGIC, 9, 1, 7, mid(), 0, 1, 0, 4) + b"abcd",
        _chunk(mid(), 0, 1, 0, 24, b"TWIR" + b"\xff" * 20),
    ]


def client_udp_ports(hub_url: str) -> list[tuple[str, int]]:
    """The local addresses of the UDP sockets connected to the hub's port: its clients'
    (read from /proc/net/udp, as any process on the machine can)."""
    import socket
    import struct

    from tensorwire.transports.url import host_port

    host, port = host_port(hub_url)
    hub_ip = socket.inet_aton(host)
    found = []
    with open("/proc/net/udp") as table:
        for line in table.readlines()[1:]:
            local, remote = line.split()[1:3]
            rip, rport = remote.split(":")
            if int(rport, 16) != port or struct.pack("<I", int(rip, 16)) != hub_ip:
                continue
            lip, lport = local.split(":")
            found.append((socket.inet_ntoa(struct.pack("<I", int(lip, 16))), int(lport, 16)))
    return found


def _join(address, client_id: str, udp_port: int):
    """A control connection that said hello; returns it with the hub's answer."""
    import socket

    from tensorwire.transports.session import ClientSession
    from tensorwire.wire import NEED_DATA, MessageStream

    hello = ClientSession(
        client_id, decoders=[], max_message_bytes=1 << 20, hello_meta={"udp_port": udp_port}
    ).hello()
    control = socket.create_connection(address, timeout=10)
    control.sendall(hello.to_bytes())
    stream = MessageStream()
    while (answer := stream.next_event()) is NEED_DATA:
        piece = control.recv(1 << 16)
        assert piece, f"the hub closed the connection instead of answering {client_id}'s hello"
        stream.receive_data(piece)
    return control, answer


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As strangers on the hub's machine:

    - junk and forged chunks (:func:`forged_datagrams`) at the hub's UDP port, and at each
      client's UDP port, found in /proc/net/udp (the clients' sockets are connected to the
      hub, so their kernel drops what does not come from the hub's address; spoofing that is
      not tried). Which port is which of ``client_ids`` cannot be seen from outside, nor can
      a client's control connection be reached: it is a TCP connection the client opened;
    - a stranger that joins under a fresh id and sends the same forged chunks from its own
      port, then forged control messages ('sent' for 2^32 chunks, a NACK and an ack of no
      message of the hub's, header chunks of another message), then junk on its control
      link, which ends its session; and a hello that claims a client's UDP port;
    - on new control connections: junk, a prefix declaring an 8 MiB header and a 1 TiB body,
      a hello cut short, and a hundred connections that say nothing.
    """
    import os
    import random
    import socket

    import numpy as np

    from tensorwire.transports.session import ClientSession
    from tensorwire.transports.url import host_port
    from tensorwire.wire import encode_message
    from tensorwire.wire.format import MAGIC, PREFIX, VERSION

    address = host_port(hub_url)
    clients = client_udp_ports(hub_url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for target in (address, *clients):
            for d in forged_datagrams():
                udp.sendto(d, target)
    socks = []
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((address[0], 0))
    name = f"stranger-{os.getpid()}-{random.getrandbits(32):08x}"
    control, welcome = _join(address, name, udp.getsockname()[1])
    assert welcome.kind == "welcome", welcome.meta
    for d in forged_datagrams():
        udp.sendto(d, address)
    other = _chunk(random.getrandbits(64), 0, 1, 0, 4, b"TWIR")
    for enc in (
        encode_message(None, {"id": 2, "count": 2**32}, kind="sent"),
        encode_message({"ranges": np.array([[0, 1 << 40]])}, {"id": 7}, kind="nack"),
        encode_message(None, {"id": "seven"}, kind="ack"),
        encode_message(
            {
                "head_chunks": np.frombuffer(other, np.uint8),
                "head_sizes": np.array([len(other)], np.int64),
            },
            {"id": 8, "count": 1},
            kind="sent",
        ),
    ):
        control.sendall(enc.to_bytes())
    control.sendall(b"\xde\xad\xbe\xef" * 64)
    socks += [control, udp]
    for _, port in clients[:1]:
        thief, answer = _join(address, f"thief-{os.getpid()}", port)
        assert answer.kind == "refuse", answer.meta
        socks.append(thief)
    hello = ClientSession("cut", decoders=[], max_message_bytes=1, hello_meta={"udp_port": 9})
    for payload in (
        b"\xde\xad\xbe\xef" * 64,
        PREFIX.pack(MAGIC, VERSION, 0, 0, (8 << 20) - 1, 0, 1 << 40),
        hello.hello().to_bytes()[:40],
    ):
        s = socket.create_connection(address, timeout=10)
        s.sendall(payload)
        socks.append(s)
    for _ in range(100):  # more than the hub lets wait for a hello: the rest are closed at once
        socks.append(socket.create_connection(address, timeout=10))
    for s in socks:
        s.close()


def proxy_target(hub_url: str) -> tuple[str, int]:
    """Where a recording proxy forwards a client's control connection to: the hub's port."""
    from tensorwire.transports.url import host_port

    return host_port(hub_url)


def proxied_url(hub_url: str, port: int) -> str:
    """The hub's URL with its control connection reached through a TCP proxy on 127.0.0.1:``port``
    (the datagrams go straight to the UDP port the hub's welcome names; test_udp_hostile.py checks
    that they are sealed)."""
    from urllib.parse import urlsplit

    return f"udp://127.0.0.1:{port}?{urlsplit(hub_url).query}"
