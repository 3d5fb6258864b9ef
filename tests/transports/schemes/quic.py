"""quic:// under the conformance suite.

Strangers speak QUIC themselves here, with aioquic's sans-IO connection over a plain UDP
socket (:class:`RawQuic`), so they can do what no tensorwire channel would: skip the hello,
send junk on a stream, cut a message short, open streams out of order.
"""

SCHEME = "quic"

LOOPBACK_MTU = 16000  # the most quic:// takes: fewer packets per message on loopback


def hub_url(request) -> str:
    """URL to serve a fresh hub on (port 0: any free port)."""
    import pytest

    pytest.importorskip("aioquic", reason="aioquic is not installed (extra 'quic')")
    return f"quic://127.0.0.1:0?mtu={LOOPBACK_MTU}"


class RawQuic:
    """A bare QUIC client of a hub: aioquic's connection, pumped by hand (bounded in time)."""

    def __init__(self, hub_url: str, timeout: float = 10.0, handshake: bool = True) -> None:
        import socket
        import ssl
        import time

        from aioquic.quic.configuration import QuicConfiguration
        from aioquic.quic.connection import QuicConnection
        from aioquic.quic.events import HandshakeCompleted

        from tensorwire.transports.url import host_port

        self.address = host_port(hub_url)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect(self.address)
        self.sock.settimeout(0.01)
        config = QuicConfiguration(is_client=True, alpn_protocols=["tensorwire"])
        config.verify_mode = ssl.CERT_NONE
        self.conn = QuicConnection(configuration=config)
        self.conn.connect(self.address, now=time.monotonic())
        self.received: dict[int, bytes] = {}
        deadline = time.monotonic() + (timeout if handshake else 0.02)
        done = not handshake
        while not done and time.monotonic() < deadline:
            for event in self.pump(0.02):
                done = done or isinstance(event, HandshakeCompleted)
        assert done, "no QUIC handshake with the hub"

    def pump(self, seconds: float) -> list:
        """Move datagrams both ways for ``seconds``; return the connection's events."""
        import contextlib
        import time

        from aioquic.quic.events import StreamDataReceived

        out = []
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            for data, _ in self.conn.datagrams_to_send(now=now):
                self.sock.send(data)
            timer = self.conn.get_timer()
            if timer is not None and timer <= now:
                self.conn.handle_timer(now)
            with contextlib.suppress(TimeoutError, BlockingIOError, ConnectionRefusedError):
                self.conn.receive_datagram(self.sock.recv(65536), self.address, now=now)
            while (event := self.conn.next_event()) is not None:
                if isinstance(event, StreamDataReceived):
                    self.received[event.stream_id] = (
                        self.received.get(event.stream_id, b"") + event.data
                    )
                out.append(event)
            if now >= end:
                return out

    def send(self, data: bytes, end: bool = True, stream_id: int | None = None) -> int:
        """Send ``data`` on a new unidirectional stream (or ``stream_id``); return its id."""
        if stream_id is None:
            stream_id = self.conn.get_next_available_stream_id(is_unidirectional=True)
        self.conn.send_stream_data(stream_id, data, end_stream=end)
        self.pump(0.05)
        return stream_id

    def hello(self, client_id: str) -> bytes:
        """Say hello as ``client_id``; return the hub's answer (raw bytes)."""
        from tensorwire.transports.session import ClientSession

        hello = ClientSession(client_id, decoders=[], max_message_bytes=1 << 20).hello()
        self.send(hello.to_bytes())
        for _ in range(100):
            if self.received:
                break
            self.pump(0.05)
        return next(iter(self.received.values()), b"")

    def close(self) -> None:
        self.conn.close(error_code=0, reason_phrase="bye")
        self.pump(0.02)
        self.sock.close()


def inject_garbage(hub_url: str) -> None:
    """Join as client "intruder", then send a stream of bytes that are no message."""
    raw = RawQuic(hub_url)
    assert b"welcome" in raw.hello("intruder")
    raw.send(b"\xde\xad\xbe\xef" * 64)
    raw.pump(0.2)
    raw.close()


def client_udp_ports(hub_url: str) -> list[tuple[str, int]]:
    """The local addresses of the UDP sockets connected to the hub's port (its clients'),
    read from /proc/net/udp, as any process on the machine can."""
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


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As strangers on the hub's machine:

    - junk datagrams, and datagrams shaped like QUIC packets of no connection, at the hub's
      port and at each client's (found in /proc/net/udp; their sockets are connected to the
      hub, so the kernel drops what does not come from its address);
    - on QUIC connections of their own: junk instead of a hello; a prefix declaring an 8 MiB
      header; a hello, then a message declaring a 1 GiB body cut short, a stream with more
      bytes than its message, a stream opened far ahead of the next one, a bidirectional
      stream, junk; and a hundred connections that never say hello.
    """
    import os
    import socket

    import numpy as np

    from tensorwire.transports.url import host_port
    from tensorwire.wire import encode_message
    from tensorwire.wire.format import MAGIC, PREFIX, VERSION

    address = host_port(hub_url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for target in (address, *client_udp_ports(hub_url)):
            udp.sendto(b"\xde\xad\xbe\xef" * 64, target)
            udp.sendto(b"\xc0\x00\x00\x00\x01\x08" + os.urandom(1300), target)  # an Initial
            udp.sendto(b"\x40" + os.urandom(8) + os.urandom(100), target)  # a short header
    raws = []
    junk = RawQuic(hub_url)
    junk.send(b"\xde\xad\xbe\xef" * 64)
    raws.append(junk)
    huge = RawQuic(hub_url)
    huge.send(PREFIX.pack(MAGIC, VERSION, 0, 0, (8 << 20) - 1, 0, 1 << 40), end=False)
    raws.append(huge)
    member = RawQuic(hub_url)
    member.hello(f"stranger-{os.getpid()}-{os.urandom(4).hex()}")
    big = encode_message({"x": np.zeros(4, np.float32)}, {}).to_bytes()
    lying = bytearray(big)
    lying[16:24] = (1 << 30).to_bytes(8, "little")  # body length: 1 GiB, then the stream ends
    member.send(bytes(lying))
    member.send(big + b"more bytes than the message")
    ahead = member.conn.get_next_available_stream_id(is_unidirectional=True) + 4 * 400
    member.send(big, stream_id=ahead)  # waits behind streams that never come
    member.send(b"\xde\xad" * 32, stream_id=0)  # bidirectional
    member.send(b"\xde\xad\xbe\xef" * 64)
    member.pump(0.2)
    raws.append(member)
    for _ in range(100):  # more than the hub lets wait for a hello: the rest get no answer
        raws.append(RawQuic(hub_url, handshake=False))
    for raw in raws:
        raw.close()
