"""What one broker message carries: one chunk of a tensorwire message, sealed end to end with a
MAC trailer (``security.seal``) on a session with a key, and the receiver's check of it.

A broker is a shared medium: any of its users can publish where our peers read, so a session
with a key seals every payload and the receiver unseals it before it reassembles anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from tensorwire.errors import AuthenticationError, WireError
from tensorwire.transports.security import ReplayWindow, Sealer, unseal
from tensorwire.transports.session import HELLO_LIMITS
from tensorwire.wire import EncodedMessage, iter_chunks, new_message_id, parse_chunk

HUB_SENDER = b"hub"  # the sender the hub's MACs name (docs/security.md)


def sealed(parts: Sequence[Any], sealer: Sealer | None) -> bytes:
    """One payload: the chunk made of ``parts`` and its trailer if there is a ``sealer`` (the
    broker clients take bytes only: the one copy a send makes)."""
    return b"".join(parts if sealer is None else [*parts, sealer(parts)])


def one_chunk(enc: EncodedMessage, sealer: Sealer | None = None) -> bytes:
    """A small message as the one chunk that carries it, under a fresh message id (a receiver
    drops a chunk whose id it has completed, so each publish of a session message needs one),
    sealed if there is a ``sealer``."""
    return sealed(next(iter_chunks(enc.frames(), new_message_id(), max(enc.nbytes, 1))), sealer)


def lone_chunk(payload: bytes) -> memoryview | None:
    """The message a payload carries if it is one unsealed chunk of at most a hello's size,
    else None (a sealed payload has bytes past its chunk)."""
    try:
        head, body = parse_chunk(payload)
    except WireError:
        return None
    whole = head.count == 1 and len(body) == head.total_length
    return body if whole and len(body) <= HELLO_LIMITS.max_message_bytes else None


def unsealed(
    payload: bytes, key: bytes, sender: bytes, window: ReplayWindow, repeated: bool
) -> memoryview | None:
    """The chunk a sealed payload from ``sender`` carries, once its MAC and sequence number are
    checked; :class:`AuthenticationError` if it is missing, forged, altered or replayed.

    None for the broker's own redelivery (``repeated``: MQTT's DUP flag, AMQP's
    ``redelivered``), which it makes when our acknowledgement may have been lost and no other
    user of the broker can cause: an authentic payload seen before that comes so is a duplicate.
    """
    view = memoryview(payload)
    try:
        return unseal(view, key, sender, window)
    except AuthenticationError:
        if repeated:
            with contextlib.suppress(AuthenticationError):
                unseal(view, key, sender, ReplayWindow())  # authentic: refused as a repeat
                return None
        raise
