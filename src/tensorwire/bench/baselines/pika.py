"""The pika + RabbitMQ baseline: what a pika user writes to move an array through a queue.

The sender ``basic_publish``-es ``arr.tobytes()`` to a queue, as one message when it fits the
broker's ``max_message_size`` (128 MiB by default), else as consecutive slices with the total
length in a header; the receiver copies each body into one reused numpy buffer and publishes a
1-byte ack to a second queue. pika's defaults throughout: no publisher confirms, automatic acks.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pika

NAME = "pika"
BROKER = "amqp://guest:guest@127.0.0.1:5672/%2F"
MAX_MESSAGE = 128 << 20  # bytes: RabbitMQ's default max_message_size
_ACK_TIMEOUT = 120.0  # seconds


class Sender:
    def __init__(self, url: str = BROKER) -> None:
        self._conn = pika.BlockingConnection(pika.URLParameters(url))
        self._ch = self._conn.channel()
        self._queue = f"tw-bench-pika-{uuid.uuid4().hex[:12]}"
        self._ch.queue_declare(self._queue, auto_delete=True)
        self._ch.queue_declare(f"{self._queue}.ack", auto_delete=True)
        self._ch.basic_consume(f"{self._queue}.ack", self._on_ack, auto_ack=True)
        self._acked = False
        self.receiver_args = [url, self._queue]

    def _on_ack(self, *_: object) -> None:
        self._acked = True

    def once(self, arr: np.ndarray) -> float:
        t = time.perf_counter()
        body = arr.tobytes()
        headers = {"total": len(body)}
        for start in range(0, max(len(body), 1), MAX_MESSAGE):
            piece = body if len(body) <= MAX_MESSAGE else body[start : start + MAX_MESSAGE]
            self._ch.basic_publish("", self._queue, piece, pika.BasicProperties(headers=headers))
        self._acked = False
        deadline = time.monotonic() + _ACK_TIMEOUT
        while not self._acked and time.monotonic() < deadline:
            self._conn.process_data_events(time_limit=1.0)
        if not self._acked:
            raise TimeoutError(f"no ack from the pika receiver within {_ACK_TIMEOUT} s")
        return time.perf_counter() - t

    def close(self) -> None:
        self._ch.queue_delete(self._queue)  # cancels the receiver's consumer: it returns
        self._ch.queue_delete(f"{self._queue}.ack")
        self._conn.close()


def receive(args: list[str]) -> None:
    url, queue = args
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    buf = np.empty(0, np.uint8)
    filled = 0

    def on_message(channel: object, method: object, props: pika.BasicProperties, body: bytes):
        nonlocal buf, filled
        total = int((props.headers or {}).get("total", len(body)))
        if buf.nbytes != total:
            buf = np.empty(total, np.uint8)
        buf[filled : filled + len(body)] = np.frombuffer(body, np.uint8)
        filled += len(body)
        if filled == total:
            filled = 0
            ch.basic_publish("", f"{queue}.ack", b"k")

    ch.basic_consume(queue, on_message, auto_ack=True)
    ch.start_consuming()  # until the sender deletes the queue
    conn.close()
