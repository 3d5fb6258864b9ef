"""What both directions of a flow share: the peer, its control connection (control messages
out, its round-trip time) and the timeouts that follow from it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tensorwire.errors import MalformedHeader, TransportError, WireError
from tensorwire.transports.udp.loss import Received
from tensorwire.transports.udp.options import UdpOptions
from tensorwire.transports.udp.secure import DatagramSeal
from tensorwire.transports.udp.sockets import (
    MAX_DATAGRAM,
    ControlReader,
    ControlWriter,
    control_rtt,
)
from tensorwire.transports.udp.stats import UdpStats
from tensorwire.wire import Limits, Message, encode_message

log = logging.getLogger("tensorwire.transports.udp")

MAX_NACK_RANGES = 1 << 16  # ranges per NACK (bounds a control message); the rest next round
RELIABLE_IDLE = 120.0  # seconds a reliable message may get no datagram before it is dropped
IDLE_FLOOR = 1.0  # seconds: best-effort idle timeout at least (thread scheduling hiccups)
IDLE_RTTS = 64  # best-effort idle timeout in RTTs / datagram times, when that is longer
CONTROL_HEADER_BYTES = 64 << 10  # a control message's header (a few fields) is far smaller


def control_limits(limits: Limits) -> Limits:
    """What a joined peer's control messages may be: small headers, and bodies up to a
    NACK's ranges or the header chunks a best-effort ``sent`` carries (those of a message
    whose header is within ``limits``, cut with an mtu of 80 bytes or more)."""
    body = max(16 * MAX_NACK_RANGES, 2 * limits.max_header_bytes) + 2 * MAX_DATAGRAM
    return Limits(max_header_bytes=CONTROL_HEADER_BYTES, max_message_bytes=body, max_tensors=2)


def int_field(msg: Message, name: str, low: int, high: int) -> int:
    value = msg.meta.get(name)
    if type(value) is not int or not low <= value <= high:
        raise MalformedHeader(
            f"control message {msg.kind!r}: {name!r} must be an integer in [{low}, {high}], "
            f"got {value!r}"
        )
    return value


class FlowBase:
    """The state a :class:`~tensorwire.transports.udp.flow.Flow`'s constructor sets (for its
    two halves and its owner), and the control messages and timing both halves use."""

    label: str
    session: Any
    mode: str
    reliable: bool
    options: UdpOptions
    udp: Any
    address: Any
    reader: ControlReader
    writer: ControlWriter
    control: Any
    stats: UdpStats
    limits: Limits
    seal: DatagramSeal | None
    _deliver: Callable[[Received | WireError], None]
    _reject: Callable[[Exception], None]
    _rtt_fallback: float

    @property
    def rtt(self) -> float:
        """Smoothed round-trip time of the control connection, seconds."""
        return control_rtt(self.control, self._rtt_fallback)

    def grace(self) -> float:
        """Seconds a best-effort receiver waits after ``sent`` (or a message's last datagram)
        for datagrams still on the way: two control-connection round trips and 1 ms."""
        return 2 * self.rtt + 0.001

    def idle_timeout(self) -> float:
        """Seconds without a datagram after which an incoming message is given up on."""
        if self.reliable:
            return RELIABLE_IDLE
        gap = self.options.mtu * 8 / self.options.rate if self.options.rate else 0.0
        return max(IDLE_FLOOR, IDLE_RTTS * self.rtt, IDLE_RTTS * gap)

    # -- control messages --------------------------------------------------------------

    def send_control(
        self, kind: str, meta: dict[str, Any], tensors: dict[str, Any] | None = None
    ) -> None:
        """Queue one control message, never blocking; ``PeerGone`` if the connection is
        unusable (broken, or the peer leaves too much unread)."""
        self.writer.write(encode_message(tensors, meta, kind=kind))

    def _say(self, kind: str, meta: dict[str, Any]) -> None:
        """A control message whose loss changes nothing (the flow is ending anyway)."""
        try:
            self.send_control(kind, meta)
        except TransportError as exc:
            log.debug("udp: could not send %r to %s: %s", kind, self.label, exc)
