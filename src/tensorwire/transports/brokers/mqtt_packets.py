"""The few MQTT 3.1.1 packets tensorwire writes without paho: a broker probe's CONNECT, and
the minimal clients of ``tensorwire.bench.mqtt_floor``."""

from __future__ import annotations

import struct


def remaining_length(n: int) -> bytes:
    """MQTT's variable-length integer."""
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(b: bytes) -> bytes:
    return struct.pack("!H", len(b)) + b


def connect_packet(client_id: str, keepalive_s: int) -> bytes:
    """CONNECT: protocol "MQTT" level 4, a clean session, no credentials."""
    body = _string(b"MQTT") + bytes([4, 2]) + struct.pack("!H", keepalive_s)
    body += _string(client_id.encode())
    return b"\x10" + remaining_length(len(body)) + body


def subscribe_packet(topic: bytes, qos: int) -> bytes:
    body = struct.pack("!H", 1) + _string(topic) + bytes([qos])
    return b"\x82" + remaining_length(len(body)) + body


def publish_header(topic: bytes, payload_bytes: int, qos: int, packet_id: int = 1) -> bytes:
    """A PUBLISH's fixed and variable header; its payload follows."""
    var = _string(topic) + (struct.pack("!H", packet_id) if qos else b"")
    return bytes([0x30 | qos << 1]) + remaining_length(len(var) + payload_bytes) + var
