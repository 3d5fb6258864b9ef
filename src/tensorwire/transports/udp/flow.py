"""One peer of a udp:// endpoint, its flow: its messages' datagrams in both directions, and
the control messages about them. The sending window is ``sending.py``, the receiving and
NACK state ``receiving.py``, best-effort loss ``loss.py``; what both share ``flow_base.py``.

Sending: a message is encoded once and cut into chunks (``iter_chunks``), one datagram each,
paced by the flow's token bucket; then a ``sent`` control message says the sender is done.

- ``reliable``: the receiver answers ``sent`` with ``nack`` (the missing chunk indices as
  ranges, from ``ChunkReassembler.missing_ranges``, and the rate it received at) or, once it
  has every chunk, ``ack``. The sender resends what a NACK lists and says ``sent`` again,
  until the ack. Both go over TCP, so no timer is needed to detect a lost NACK; the only
  waits are the caller's deadline and a bound on an unanswered peer.
- ``best-effort``: no tensor byte is resent. ``sent`` also carries the chunks that hold the
  message's prefix and header (over TCP), so a message is never lost whole. The receiver
  decodes what arrived one grace period (two RTTs of the control connection) after the
  datagrams end: after ``sent``, or after the message's last datagram if that brings it what
  it can deliver first (a loss on the control connection holds ``sent`` back for TCP's
  retransmission timeout, 200 ms or more), or after an idle timeout if neither comes (a long
  one while the header is still missing), if its header and at least half of its bytes came
  (else it is lost).

With a ``seal`` (``secure.py``: the control connection is under TLS) every datagram is
sealed with an AEAD on its way out and opened on its way in; one that does not verify, or
came before, is dropped and counted before the chunk path sees it.

Receiving runs in the endpoint's I/O thread, and so does everything that touches a flow's
incoming messages; each message has its own ``ChunkReassembler`` so finishing one
(complete, partial or dropped) never touches another. What a message costs is bounded by
the bytes that arrived, never by the sizes its chunks or header declare.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensorwire.errors import WireError
from tensorwire.transports.udp.flow_base import int_field, log
from tensorwire.transports.udp.loss import Received
from tensorwire.transports.udp.options import UdpOptions
from tensorwire.transports.udp.receiving import FlowReceiving
from tensorwire.transports.udp.secure import DatagramSeal
from tensorwire.transports.udp.sending import Feedback, FlowSending, nack_ranges
from tensorwire.transports.udp.sockets import ControlReader, ControlWriter
from tensorwire.transports.udp.stats import UdpStats
from tensorwire.wire import Limits, Message


class Flow(FlowSending, FlowReceiving):
    """Datagrams and control messages between this endpoint and one peer.

    ``address`` is where the peer's datagrams go (None: ``udp`` is connected to it);
    ``deliver`` gets each finished incoming message, or the ``WireError`` that lost a message
    the peer announced with ``sent``; ``reject`` gets the error of input that is dropped (a
    bad chunk, a message nobody announced that could not be kept). Both run in the I/O
    thread. ``session`` is the peer's session state machine (the hub's ``HubSession`` or the
    channel's ``ClientSession``), fed the session's messages on the control connection.
    :meth:`send_message` runs in the caller's thread; the ``on_*`` methods,
    :meth:`tick` and :meth:`flush` in the I/O thread, which alone touches incoming messages.
    ``seal`` (None: datagrams in clear) seals and opens the datagrams of a secured session.
    """

    def __init__(
        self,
        *,
        label: str,
        mode: str,
        options: UdpOptions,
        udp: Any,
        address: Any,
        reader: ControlReader,
        writer: ControlWriter,
        deliver: Callable[[Received | WireError], None],
        reject: Callable[[Exception], None],
        stats: UdpStats,
        limits: Limits,
        session: Any,
        rtt_fallback: float = 0.001,
        seal: DatagramSeal | None = None,
    ) -> None:
        self.label = label
        self.session = session
        self.mode = mode
        self.reliable = mode == "reliable"
        self.options = options
        self.udp = udp
        self.address = address
        self.reader = reader
        self.writer = writer
        self.control = reader.sock
        self.stats = stats
        self.limits = limits
        self._deliver = deliver
        self._reject = reject
        self._rtt_fallback = rtt_fallback
        self.seal = seal
        self._init_sending()
        self._init_receiving()

    def on_control(self, msg: Message, now: float) -> None:
        """Act on a control message from the peer (not hello/welcome/bye: the session's).
        ``WireError`` if it is malformed, ``PeerGone`` if answering it failed."""
        if msg.kind == "sent":
            self._on_sent(msg, now)
        elif msg.kind in ("ack", "nack"):
            mid = int_field(msg, "id", 0, 2**64 - 1)
            with self._out_lock:
                out = self._outgoing.get(mid)
            if out is None:
                return  # an answer about a message already acknowledged or abandoned
            if msg.kind == "ack":
                out.post(Feedback(acked=True))
            else:
                rate = msg.meta.get("rate")
                out.post(
                    Feedback(
                        acked=False,
                        ranges=nack_ranges(msg, out.count),
                        rate=float(rate) if isinstance(rate, (int, float)) and rate > 0 else None,
                    )
                )
        elif msg.kind == "drop":
            mid = int_field(msg, "id", 0, 2**64 - 1)
            if self._incoming.pop(mid, None) is not None:
                self._finish(mid, delivered=False)
        else:
            log.debug("udp: ignoring control message %r from %s", msg.kind, self.label)
