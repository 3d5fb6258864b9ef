"""What a flow delivers, and best-effort loss: whether a message that lost datagrams is
kept, and the fraction of each tensor's bytes it lost."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.codecs import get_codec
from tensorwire.errors import MessageTooLarge
from tensorwire.wire import Limits, Message
from tensorwire.wire.format import (
    DIGEST_SIZE,
    PREFIX,
    PREFIX_SIZE,
    parse_header,
    parse_prefix,
    verify_header,
)
from tensorwire.wire.partial import decode_partial
from tensorwire.wire.tensors import TensorPath, flatten

PARTIAL_MIN_ARRIVED = 0.5  # a best-effort message with less of its bytes than this is lost
PARTIAL_EXPANSION = 64  # a partial message's lost compressed tensors may decode to this x arrived


@dataclass
class Received:
    """A message a peer sent: whole (``missing`` empty) or with lost byte ranges
    (``(offset, length)``, best-effort) and ``arrived`` bytes of it received; ``first_at``
    is ``time.perf_counter()`` at its first datagram."""

    message_id: int
    data: np.ndarray
    missing: list[tuple[int, int]]
    first_at: float
    arrived: int


def header_arrived(lead: memoryview) -> bool:
    """Whether ``lead`` (a message's bytes from offset 0 without a gap) holds its prefix and
    its whole header, so that every tensor can be placed."""
    return len(lead) >= PREFIX_SIZE and len(lead) >= PREFIX_SIZE + PREFIX.unpack_from(lead)[4]


def check_partial(got: Received, limits: Limits) -> None:
    """Raise ``MessageTooLarge`` when a partial message's lost compressed tensors would
    decode to more than ``PARTIAL_EXPANSION`` x its arrived bytes: each gets a whole new
    array (zeros where there is no previous one), which its lost bytes cannot bound."""
    mv = got.data.data
    prefix = parse_prefix(mv, limits)
    end = PREFIX_SIZE + prefix.header_length
    verify_header(mv[PREFIX_SIZE:end], prefix)
    plan = parse_header(mv[PREFIX_SIZE:end], prefix, limits)
    starts = np.fromiter((o for o, _ in got.missing), np.int64, len(got.missing))
    ends = starts + np.fromiter((n for _, n in got.missing), np.int64, len(got.missing))
    lost, offset = 0, end
    for spec in plan.tensors:
        a, b = offset, offset + spec.size
        offset = b + (DIGEST_SIZE if plan.digests else 0)
        i = int(np.searchsorted(ends, a, side="right"))  # the first gap ending after a
        if spec.codecs and i < len(starts) and starts[i] < b:
            lost += spec.nbytes
    if lost > PARTIAL_EXPANSION * got.arrived:
        raise MessageTooLarge(
            f"a partial message whose lost compressed tensors decode to {lost} bytes, over "
            f"{PARTIAL_EXPANSION} x the {got.arrived} bytes that arrived"
        )


def decode_received(
    endpoint: Any, got: Received, out: Mapping[TensorPath, np.ndarray] | None
) -> Message:
    """Decode what a flow delivered; the message gets ``loss``, the fraction of each
    tensor's bytes (``"a/b"`` path -> 0.0 to 1.0) this message did not deliver."""
    if got.missing:
        check_partial(got, endpoint.limits)
        msg, loss = decode_partial(
            got.data, got.missing, out=out, limits=endpoint.limits, codec_lookup=get_codec
        )
        msg.recv_s = time.perf_counter() - got.first_at
    else:
        msg = endpoint._decode_whole(got.data, got.first_at, out)
        loss = {"/".join(path): 0.0 for path, _ in flatten(msg.tensors)}
    msg.loss = loss  # type: ignore[attr-defined]
    return msg
