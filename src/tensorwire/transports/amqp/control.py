"""Session messages on RabbitMQ: always one chunk, told apart from sealed bodies, and said to a
queue by name on the control channel of the endpoint's connection."""

from __future__ import annotations

import logging
from typing import Any

import pika.exceptions as px

from tensorwire.errors import SessionRefused, WireError
from tensorwire.transports.amqp.connection import props
from tensorwire.transports.broker import one_chunk
from tensorwire.transports.security import Sealer
from tensorwire.transports.session import HELLO_LIMITS, HubSession
from tensorwire.wire import EncodedMessage, Message, decode_message, encode_message

log = logging.getLogger("tensorwire.transports.amqp")


def session_message(payload: Any) -> Message | None:
    """A session message decoded under the hello limits, or None if it is none."""
    try:
        msg = decode_message(payload, limits=HELLO_LIMITS)
    except WireError:
        return None
    return msg if msg.kind in ("hello", "welcome", "refuse", "bye") else None


def refusal(exc: SessionRefused, session: Any) -> EncodedMessage:
    """:meth:`HubSession.refusal`, naming the session the hello opened (if it named a valid
    one): a client takes only the refusal of its own session."""
    meta = dict(decode_message(HubSession.refusal(exc).to_bytes(), limits=HELLO_LIMITS).meta)
    if isinstance(session, str) and 1 <= len(session) <= 64:
        meta["session"] = session
    return encode_message(None, meta, kind="refuse")


def say(
    ch: Any,
    queue: str,
    enc: EncodedMessage,
    sender: str,
    sealer: Sealer | None = None,
    persistent: bool = True,
) -> bool:
    """Publish a session message to ``queue`` on the channel ``ch``, sealed if there is a
    ``sealer``, kept on the broker's disk if ``persistent``; on a confirming channel, False
    if no queue takes it (its owner left) or the broker refused it (the hub's does not wait
    to know: True)."""
    try:
        ch.basic_publish(
            "", queue, one_chunk(enc, sealer), props(sender, persistent), mandatory=True
        )
        return True
    except (px.UnroutableError, px.NackError) as exc:
        log.debug("amqp: a session message to %r not taken: %r", queue, exc)
        return False
