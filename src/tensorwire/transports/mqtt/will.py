"""The will: the ``bye`` the broker publishes for a peer whose connection dies unannounced, the
grace it leaves the peer to come back, and the key that seals a client's wills."""

from __future__ import annotations

import hashlib
import hmac

from tensorwire.wire import EncodedMessage, Message, encode_message

# Seconds of connected time a peer whose will came has to say hello (or answer one) again:
# Mosquitto publishes every will when it shuts down, so a restart must not end the sessions.
# Covers the longest reconnect backoff plus a hello's round trip, with room for a busy host.
WILL_GRACE_S = 8.0
_WILL_LABEL = b"tensorwire mqtt will key v2"


def will(reason: str) -> EncodedMessage:
    """The ``bye`` the broker publishes for us when our connection dies unannounced."""
    return encode_message(None, {"reason": reason, "will": True}, kind="bye")


def is_will(msg: Message) -> bool:
    return msg.kind == "bye" and msg.meta.get("will") is True


def will_key(secret: bytes, client_id: str, session: str) -> bytes:
    """The key of a session's wills and of a client's bye before its welcome (32 bytes): both
    sides derive it from the client's secret and the session id, which the will needs at
    CONNECT, before the hub's nonce and with it the session key exist."""
    message = b"\0".join([_WILL_LABEL, client_id.encode(), session.encode()])
    return hmac.new(secret, message, hashlib.sha256).digest()
