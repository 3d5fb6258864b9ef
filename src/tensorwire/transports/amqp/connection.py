"""Reaching RabbitMQ with pika: one connection attempt, retried ones, and what every message
and queue of ours carries (the sender's header, persistence, the queues' expiry)."""

from __future__ import annotations

import contextlib
import copy
import logging
import re
import ssl
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pika
import pika.exceptions as px
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorException,
    AMQPConnectorPhaseErrorBase,
    AMQPConnectorSocketConnectError,
)

from tensorwire.errors import AuthenticationError, BrokerFull, SessionRefused, TransportError
from tensorwire.transports.amqp.settings import QUEUE_EXPIRES_MS, AmqpAddress
from tensorwire.transports.base import dial, remaining
from tensorwire.transports.session import CLIENT_ID

log = logging.getLogger("tensorwire.transports.amqp")

_READ_BYTES = 1 << 16  # see _widen_reads
CLIENT_HEADER = "tw-client"
_QUEUE_ARGS = {"x-expires": QUEUE_EXPIRES_MS}
# RabbitMQ's refusal at a vhost's (or user's) max-connections
_FULL = re.compile(r"connection limit \((\d+)\) is reached")
_PERSISTENT = 2  # AMQP delivery mode: the broker keeps the message on disk until consumed
_TRANSIENT = 1  # in its memory only: a broker restart loses it

# pika logs every failed connection attempt and lost connection at ERROR, with tracebacks; those
# are the broker outages this module rides out and reports itself.
for _name in (
    "pika.connection",
    "pika.adapters.base_connection",
    "pika.adapters.blocking_connection",
    "pika.adapters.utils.connection_workflow",
    "pika.adapters.utils.io_services_utils",
):
    logging.getLogger(_name).setLevel(logging.CRITICAL)


def _widen_reads(conn: Any) -> None:
    """Read the socket 64 KiB at a time instead of pika's 4 KiB.

    pika appends every read to its frame buffer and re-slices it per frame: with 4 KiB reads a
    72 MB message takes ~310 ms to arrive on loopback, with 64 KiB ~120 ms (larger reads make
    the re-slicing cost more again). The attribute is private to pika: left alone if absent.
    """
    transport = getattr(getattr(conn, "_impl", conn), "_transport", None)
    if transport is not None and hasattr(transport, "_MAX_RECV_BYTES"):
        transport._MAX_RECV_BYTES = _READ_BYTES


def params_for(
    address: AmqpAddress, deadline: float | None, name: str
) -> pika.ConnectionParameters:
    """``address``'s parameters for one attempt named ``name``, whose socket and handshake
    timeouts end by ``deadline`` (but 1 s at least)."""
    params = copy.copy(address.params)
    params.client_properties = {"connection_name": name, "product": "tensorwire"}
    left = remaining(deadline)
    if left is not None:
        left = max(left, 1.0)
        params.socket_timeout = min(address.params.socket_timeout or left, left)
        params.stack_timeout = min(address.params.stack_timeout or left, left)
    return params


def connect_once(
    address: AmqpAddress, deadline: float | None, name: str
) -> pika.BlockingConnection:
    """One attempt at a pika connection, within ``deadline`` (but 1 s at least).

    A refused credential or vhost is final (``SessionRefused``); anything else that keeps the
    broker from answering is a ``TransportError``, for :func:`dial` to retry.
    """
    try:
        conn = pika.BlockingConnection(params_for(address, deadline, name))
    except Exception as exc:
        raise failure(address, exc) from None
    _widen_reads(conn)
    return conn


def failure(address: AmqpAddress, exc: BaseException) -> BaseException:
    """What a failed connection attempt raises: a refusal is final (``SessionRefused``:
    credentials, vhost, the broker's connection limit, an untrusted certificate), anything
    else that kept the broker from answering a ``TransportError`` (retried); others as is."""
    if isinstance(exc, AMQPConnectionWorkflowFailed):  # an attempt of the async workflow
        exc = exc.exceptions[-1] if exc.exceptions else exc
        if isinstance(exc, AMQPConnectorSocketConnectError):
            exc = exc.exception or exc
        elif isinstance(exc, AMQPConnectorPhaseErrorBase) and exc.exception is not None:
            exc = exc.exception
    if isinstance(exc, ssl.SSLCertVerificationError):  # final: retrying will not change it
        return AuthenticationError(
            f"RabbitMQ at {address.where} has a certificate this side does not trust "
            f"({exc.verify_message}): give tls=TLS(ca=...) the CA that signed it, and "
            "servername= the name it carries if that is not the URL's host"
        )
    if isinstance(exc, (px.ProbableAuthenticationError, px.AuthenticationError)):
        return AuthenticationError(
            f"RabbitMQ at {address.where} refused the credentials in the URL: {exc!r}"
        )
    if isinstance(exc, px.ProbableAccessDeniedError):
        full = _FULL.search(str(exc))
        if full:
            return BrokerFull(
                f"RabbitMQ at {address.where} refused the connection: it holds its "
                f"connection limit ({full[1]} connections); this device does not fit until "
                "another leaves: give the broker room for more devices "
                "(RabbitMQBroker(devices=N), or its vhost's max-connections)"
            )
        return SessionRefused(f"RabbitMQ at {address.where}: no access to the vhost: {exc!r}")
    # AMQPConnectorException: pika's stack_timeout during the handshake, not an AMQPError.
    if isinstance(exc, (px.AMQPError, AMQPConnectorException, OSError)):
        return TransportError(f"{exc!r}{_port_hint(address, exc)}")
    return exc


def _port_hint(address: AmqpAddress, exc: BaseException) -> str:
    """Why a connection may have failed when one side speaks TLS and the other does not."""
    if address.tls is not None and isinstance(exc, ssl.SSLError):
        return " (is that port plain AMQP? RabbitMQ's TLS listener is usually 5671)"
    if address.tls is None and isinstance(exc, px.IncompatibleProtocolError):
        return " (is that port RabbitMQ's TLS listener? use amqps:// or tls=)"
    return ""


def connect_blocking(
    address: AmqpAddress, deadline: float | None, name: str
) -> pika.BlockingConnection:
    """Open a pika connection, retrying with backoff until ``deadline`` while the broker does
    not answer (:class:`TransportTimeout` then); a refused credential raises at once."""
    return dial(
        lambda d: connect_once(address, d, name),
        what=f"RabbitMQ at {address.where} (is it running?)",
        timeout=remaining(deadline),
    )


def close_quietly(conn: pika.BlockingConnection | None) -> None:
    if conn is not None and conn.is_open:
        with contextlib.suppress(px.AMQPError, OSError):  # already broken: nothing to close
            conn.close()


def props(sender: str, persistent: bool = True) -> pika.BasicProperties:
    """A message's properties: its sender, and whether the broker keeps it on disk."""
    mode = _PERSISTENT if persistent else _TRANSIENT
    return pika.BasicProperties(headers={CLIENT_HEADER: sender}, delivery_mode=mode)


def sender_of(props: Any) -> str:
    """The ``tw-client`` header if it is a valid client id, else ``?``."""
    headers = props.headers
    cid = headers.get(CLIENT_HEADER) if isinstance(headers, dict) else None
    if isinstance(cid, bytes):
        cid = cid.decode("utf-8", "replace")
    return cid if isinstance(cid, str) and CLIENT_ID.match(cid) else "?"


def declare_queue(ch: Any, queue: str) -> None:
    ch.queue_declare(queue, durable=True, arguments=_QUEUE_ARGS)


def _bind(ch: Any, queue: str, exchange: str) -> None:
    ch.queue_bind(queue, exchange)


class Admin:
    """A channel for binds and probes, on the consumer's connection and thread, opened when
    first used: a refusal (404: the queue is gone) closes it, so each gets its own channel and
    a new one follows."""

    def __init__(self, conn: pika.BlockingConnection) -> None:
        self._conn = conn
        self._ch: Any = None

    def run(self, op: Callable[[Any], Any]) -> bool:
        """Run ``op(channel)``; False if the broker refused it."""
        if self._ch is None:
            self._ch = self._conn.channel()
        try:
            op(self._ch)
            return True
        except px.ChannelClosedByBroker as exc:
            log.debug("amqp: broker refused: %s", exc.reply_text)
            self._ch = None
            return False

    def bind_all(self, queues: Sequence[str], exchange: str) -> list[bool]:
        """Bind each of ``queues`` to ``exchange``; whether each is bound. One round trip for
        all: the binds go out at once without answers (AMQP's no-wait) and a ``basic.qos``
        after them, which the broker answers once it has done what came before it on the
        channel. A bind it refused (404: the queue is gone) closed the channel and dropped the
        binds after it: then each goes again, one at a time (:meth:`run`)."""
        if len(queues) > 1:
            if self._ch is None:
                self._ch = self._conn.channel()
            try:
                for queue in queues:  # pika's own channel: no callback is a no-wait bind
                    self._ch._impl.queue_bind(queue, exchange)
                self._ch.basic_qos(prefetch_count=0)  # nothing consumes on this channel
                return [True] * len(queues)
            except px.ChannelClosedByBroker as exc:
                log.debug("amqp: broker refused a bind of %d: %s", len(queues), exc.reply_text)
                self._ch = None
        return [self.run(partial(_bind, queue=q, exchange=exchange)) for q in queues]

    def consumers(self, queue: str) -> int:
        """How many consumers ``queue`` has (0 if it does not exist)."""
        found: list[int] = []
        self.run(
            lambda ch: found.append(ch.queue_declare(queue, passive=True).method.consumer_count)
        )
        return found[0] if found else 0
