"""The messages ranks exchange over their links: tensorwire wire-format messages, told
apart by ``kind`` (no pickle: a header of msgpack scalars and raw tensor bytes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorwire.wire import EncodedMessage, Limits, encode_message

HELLO = "tw.coll.hello"  # dialler -> listener: meta rank, token (auth: secured groups)
WELCOME = "tw.coll.welcome"  # listener -> dialler: meta rank (auth: secured groups)
DATA = "tw.coll.data"  # a piece of an operation: tensor "x"; meta seq, sig
BEAT = "tw.coll.beat"  # an idle link's "still here": meta seq (last operation started)
ABORT = "tw.coll.abort"  # the group failed: meta rank (the culprit), reason, mismatch
BYE = "tw.coll.bye"  # the sender closes the group
FENCE = "tw.coll.fence"  # elastic mode: all the sender sent before is stale; meta seq

HANDSHAKE_LIMITS = Limits(max_header_bytes=4096, max_message_bytes=4096, max_tensors=0)
"""What a connection may send before it has proven it belongs to the group."""


def hello(rank: int, token: str, auth: dict[str, Any] | None = None) -> EncodedMessage:
    meta: dict[str, Any] = {"rank": rank, "token": token}
    if auth is not None:  # a secured group's proof of the link key (collective.link)
        meta["auth"] = auth
    return encode_message(None, meta, kind=HELLO)


def welcome(rank: int, auth: dict[str, Any] | None = None) -> EncodedMessage:
    meta: dict[str, Any] = {"rank": rank}
    if auth is not None:
        meta["auth"] = auth
    return encode_message(None, meta, kind=WELCOME)


def data(piece: np.ndarray, seq: int, sig: str, checksum: bool) -> EncodedMessage:
    return encode_message({"x": piece}, {"seq": seq, "sig": sig}, kind=DATA, checksum=checksum)


def beat(seq: int) -> EncodedMessage:
    return encode_message(None, {"seq": seq}, kind=BEAT)


def abort(rank: int, reason: str, mismatch: bool) -> EncodedMessage:
    return encode_message(None, {"rank": rank, "reason": reason, "mismatch": mismatch}, kind=ABORT)


def fence(seq: int) -> EncodedMessage:
    return encode_message(None, {"seq": seq}, kind=FENCE)


def bye() -> EncodedMessage:
    return encode_message(None, None, kind=BYE)
