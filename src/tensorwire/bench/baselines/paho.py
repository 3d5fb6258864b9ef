"""The paho + Mosquitto baseline: what a paho user writes to move an array through the broker.

The sender publishes the array's bytes as one QoS 1 message (``arr.tobytes()``: paho takes
bytes only) on a topic; the receiver copies the payload into a reused numpy buffer and
publishes a 1-byte ack on ``<topic>/ack``. Both set TCP_NODELAY on paho's socket, as a careful
user does. Uses the broker on 127.0.0.1:1883 if one answers, else a private Mosquitto.

Size limit: one MQTT packet carries at most 256 MiB (and a broker may allow less: its
Maximum Packet Size, read from the MQTT 5 CONNACK). An array above that is sent the simplest
honest way: consecutive slices on ``<topic>/part``, each prefixed with the array's total
length and the slice's offset (8 bytes each, little-endian), which the receiver copies into
place and acks once all bytes are in.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import uuid
from typing import Any

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tensorwire.transports.brokers.mosquitto import ensure_mosquitto
from tensorwire.transports.url import host_port

NAME = "paho-mosquitto"
_PART = struct.Struct("<QQ")  # total length, offset: bytes
_MQTT_MAX_PACKET = 268_435_455 + 5  # the protocol's largest remaining length + fixed header
_TIMEOUT = 300.0


def _client() -> paho.Client:
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"bench-{uuid.uuid4().hex[:12]}",
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    client.on_socket_open = _no_delay
    return client


def _no_delay(_client: Any, _userdata: Any, sock: Any) -> None:
    # What a careful user does (as the raw socket baseline does): no ~40 ms Nagle stalls.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _connect(client: paho.Client, host: str, port: int) -> int:
    """Connect and start the network thread; return the broker's maximum packet, bytes."""
    max_packet = [_MQTT_MAX_PACKET]
    done = threading.Event()

    def on_connect(_c: Any, _u: Any, _f: Any, _reason: Any, props: Any) -> None:
        max_packet[0] = getattr(props, "MaximumPacketSize", _MQTT_MAX_PACKET)
        done.set()

    client.on_connect = on_connect
    client.connect(host, port)
    client.loop_start()
    if not done.wait(30):
        raise TimeoutError(f"no CONNACK from the broker at {host}:{port}")
    return max_packet[0]


class Sender:
    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        url = self._stack.enter_context(ensure_mosquitto("mqtt://127.0.0.1:1883/"))
        host, port = host_port(url)
        self._topic = f"twbench-paho-{uuid.uuid4().hex[:8]}"
        self.receiver_args = [host, str(port), self._topic]
        self._acked = threading.Event()
        self._receiver_ready = False  # its first ack says it has subscribed
        self._subscribed = threading.Event()
        self._client = _client()
        self._client.will_set(self._topic, b"", qos=1)  # an empty message: receiver, stop
        self._client.on_message = lambda _c, _u, _m: self._acked.set()
        self._client.on_subscribe = lambda *_: self._subscribed.set()
        max_packet = _connect(self._client, host, port)
        self._stack.callback(self._client.loop_stop)
        self._stack.callback(self._client.disconnect)
        self._max_payload = max_packet - 16 - len(f"{self._topic}/part") - _PART.size
        self._client.subscribe(f"{self._topic}/ack", qos=1)
        self._subscribed.wait(30)

    def _wait_ack(self) -> None:
        if not self._acked.wait(_TIMEOUT):
            raise TimeoutError(f"no ack within {_TIMEOUT} s")
        self._acked.clear()

    def once(self, arr: np.ndarray) -> float:
        if not self._receiver_ready:
            self._wait_ack()
            self._receiver_ready = True
        t = time.perf_counter()
        if arr.nbytes <= self._max_payload:
            self._client.publish(self._topic, arr.tobytes(), qos=1)
        else:
            data = arr.reshape(-1).view(np.uint8).data
            for offset in range(0, len(data), self._max_payload):
                piece = data[offset : offset + self._max_payload]
                payload = _PART.pack(len(data), offset) + piece.tobytes()
                self._client.publish(f"{self._topic}/part", payload, qos=1)
        self._wait_ack()
        return time.perf_counter() - t

    def close(self) -> None:
        self._client.publish(self._topic, b"", qos=1).wait_for_publish(10)
        self._stack.close()


def receive(args: list[str]) -> None:
    host, port, topic = args[0], int(args[1]), args[2]
    buf = np.empty(0, np.uint8)
    filled = 0
    client = _client()

    def on_message(c: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        nonlocal buf, filled
        payload = msg.payload
        if not payload:  # the sender is done (or gone: its will)
            c.disconnect()
            return
        data: bytes | bytearray | memoryview
        if msg.topic == topic:
            total, offset, data = len(payload), 0, payload
        else:
            total, offset = _PART.unpack_from(payload)
            data = memoryview(payload)[_PART.size :]
        if buf.nbytes != total:
            buf = np.empty(total, np.uint8)
        buf[offset : offset + len(data)] = np.frombuffer(data, np.uint8)
        filled += len(data)
        if filled >= total:
            filled = 0
            c.publish(f"{topic}/ack", b"k", qos=1)

    client.on_message = on_message
    client.on_connect = lambda c, *_: c.subscribe([(topic, 1), (f"{topic}/part", 1)])
    client.on_subscribe = lambda c, *_: c.publish(f"{topic}/ack", b"ready", qos=1)
    client.connect(host, port)
    client.loop_forever()
