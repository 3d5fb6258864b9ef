"""Everything this package reaches for inside aioquic 1.7 (the ``quic`` extra pins it below 2),
and only here; ``tests/transports/test_quic.py`` fails if one stops working.

aioquic's public API lacks these, so they use its private attributes:

- ``QuicConnection._serialize_transport_parameters`` and ``._max_datagram_size``: to announce
  the ``max_ack_delay`` we really keep (:class:`TunedQuicConnection`).
- ``QuicConnection._handle_padding_frame`` and ``._quic_logger``: to skip a PADDING frame's
  bytes at C speed (:class:`TunedQuicConnection`).
- ``QuicConnection._initialize`` and ``.tls._request_client_certificate``: to ask a client
  for its certificate, mutual TLS (:class:`CertificateRequestingConnection`).
- ``.tls._peer_certificate`` and ``._peer_certificate_chain``: the certificate the client
  presented, to check against the hub's CA (:func:`peer_certificate`).
- ``._loss`` (its ``_pto_count``, ``_on_packets_lost``, ``on_packet_sent``,
  ``on_loss_detection_timeout``), ``._loss._pacer`` and ``._loss._cc``: to count packets
  sent and lost and probe timeouts, let pacing bursts span a millisecond of our I/O thread
  and keep a least congestion window (:func:`count_and_tune_recovery`).
- ``._streams`` (a stream's ``sender._buffer_start``, ``_buffer_stop`` and ``is_finished``):
  how much of a stream is not yet acknowledged (:func:`unacked_bytes`, :func:`stream_done`).
- ``._close_event``: a close by the peer, seen before aioquic reports it after draining
  (:func:`peer_close`).
- ``._host_cids``: our connection ids, to route datagrams by (:func:`host_connection_ids`).
- ``._state``: whether a connection is over, to forget it (:func:`terminated`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aioquic.buffer import Buffer
from aioquic.quic import events
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import pull_quic_transport_parameters, push_quic_transport_parameters
from cryptography import x509

ACK_DELAY_MS = 5
"""The ``max_ack_delay`` announced to the peer, ms (aioquic's own: 25; see
:class:`TunedQuicConnection`). At 4g with 10 % loss: 5.9 s instead of 8.9 s per 2 x 2.3 MB."""
MIN_WINDOW_PACKETS = 10
"""The least congestion window, in datagrams, a loss can shrink it to (RFC 9002 and aioquic:
2; 10 is QUIC's initial window). With 2, random loss (a radio link's, not congestion) leaves
too few packets in flight for loss to be seen by later acknowledgements: each loss waits
for a probe timeout. At 4g with 10 % loss: 3.0 s instead of 5.9 s (tcp: 4.4 s)."""
PACING_BURST_S = 0.002
"""The longest burst pacing lets go at once, in seconds of the pacing rate: the I/O thread
wakes about every millisecond at best, so a shorter one would cap the rate."""


class TunedQuicConnection(QuicConnection):
    """aioquic's connection, telling the peer how soon it really acknowledges.

    aioquic acknowledges within 1 ms (its ``K_GRANULARITY``; this package's I/O thread adds at
    most about a millisecond), yet announces the RFC's default ``max_ack_delay`` of 25 ms,
    which the peer adds to every probe timeout: on a lossy link of a few ms RTT that makes
    each tail loss cost 25 ms and more (the timeout doubles with each probe)."""

    def _serialize_transport_parameters(self) -> bytes:
        params = pull_quic_transport_parameters(
            Buffer(data=super()._serialize_transport_parameters())
        )
        params.max_ack_delay = ACK_DELAY_MS
        buf = Buffer(capacity=3 * self._max_datagram_size)
        push_quic_transport_parameters(buf, params)
        return buf.data

    def _handle_padding_frame(self, context: Any, frame_type: int, buf: Buffer) -> None:
        """aioquic's, without a Python loop step per padding byte: a client's Initial is
        padded to 1,200 bytes, and that loop took a tenth of a hub's I/O thread while 2,000
        devices joined (py-spy)."""
        pos = buf.tell()
        rest = buf.data_slice(pos, buf.capacity)
        buf.seek(pos + len(rest) - len(rest.lstrip(b"\0")))
        if self._quic_logger is not None:
            context.quic_logger_frames.append(self._quic_logger.encode_padding_frame())


class CertificateRequestingConnection(TunedQuicConnection):
    """A hub's connection that asks the client for its certificate (mutual TLS).

    aioquic's TLS layer can request a client certificate (it then checks that the client owns
    the key) but exposes the switch only as an attribute; the chain is checked against the
    hub's CA once the handshake is done (``tls.verify_client``)."""

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        self.tls._request_client_certificate = True


def peer_certificate(conn: QuicConnection) -> tuple[x509.Certificate | None, list[Any]]:
    """The certificate the peer presented (None: none) and the chain that came with it."""
    tls = conn.tls
    return getattr(tls, "_peer_certificate", None), list(
        getattr(tls, "_peer_certificate_chain", [])
    )


@dataclass
class RecoveryCounts:
    """What loss recovery did on one connection so far (aioquic keeps no totals)."""

    sent_packets: int = 0
    lost_packets: int = 0
    pto: int = 0  # probe timeouts

    def as_dict(self) -> dict[str, int]:
        return {
            "sent_packets": self.sent_packets,
            "lost_packets": self.lost_packets,
            "pto": self.pto,
        }


def count_and_tune_recovery(conn: QuicConnection) -> RecoveryCounts:
    """Count ``conn``'s packets sent, packets lost and probe timeouts (in the counts returned,
    kept up to date), let its pacing bursts span :data:`PACING_BURST_S` and keep its
    congestion window at :data:`MIN_WINDOW_PACKETS` datagrams or more."""
    counts = RecoveryCounts()
    loss = conn._loss
    on_timeout, on_lost = loss.on_loss_detection_timeout, loss._on_packets_lost

    def timeout_counted(*args: Any, **kwargs: Any) -> Any:
        before = loss._pto_count
        result = on_timeout(*args, **kwargs)
        counts.pto += loss._pto_count > before
        return result

    def lost_counted(*args: Any, **kwargs: Any) -> Any:
        packets = kwargs.get("packets", ())
        if kwargs.get("congestion_event", True):  # not a probe's early retransmission
            packets = list(packets)
            kwargs["packets"] = packets
            counts.lost_packets += len(packets)
        return on_lost(*args, **kwargs)

    on_sent = loss.on_packet_sent

    def sent_counted(*args: Any, **kwargs: Any) -> None:
        counts.sent_packets += 1
        on_sent(*args, **kwargs)

    loss.on_loss_detection_timeout = timeout_counted  # type: ignore[method-assign]
    loss._on_packets_lost = lost_counted  # type: ignore[method-assign]
    loss.on_packet_sent = sent_counted  # type: ignore[method-assign]

    # Pacing: aioquic lets a burst of at most 16 datagrams go before the next gap, which
    # a thread that wakes every millisecond at best turns into a rate cap (16 x 1350 B
    # per ms: 22 MB/s, whatever the window). Let a burst span PACING_BURST_S instead.
    pacer = loss._pacer
    update_rate = pacer.update_rate

    def burstier(*args: Any, **kwargs: Any) -> None:
        update_rate(*args, **kwargs)
        pacer.bucket_max = max(pacer.bucket_max, PACING_BURST_S)

    pacer.update_rate = burstier  # type: ignore[method-assign]

    cc = loss._cc
    floor = MIN_WINDOW_PACKETS * conn._max_datagram_size
    on_cc_lost, on_collapse = cc.on_packets_lost, cc.on_persistent_congestion

    def floored_lost(*args: Any, **kwargs: Any) -> None:
        on_cc_lost(*args, **kwargs)
        cc.congestion_window = max(cc.congestion_window, floor)

    def floored_collapse() -> None:
        on_collapse()
        cc.congestion_window = max(cc.congestion_window, floor)

    cc.on_packets_lost = floored_lost  # type: ignore[method-assign]
    cc.on_persistent_congestion = floored_collapse  # type: ignore[method-assign]
    return counts


def unacked_bytes(conn: QuicConnection, stream_id: int) -> int:
    """Bytes handed to stream ``stream_id`` that the peer has not acknowledged yet."""
    sender = conn._streams[stream_id].sender
    return sender._buffer_stop - sender._buffer_start


def stream_done(conn: QuicConnection, stream_id: int) -> bool:
    """Whether stream ``stream_id`` is gone or everything on it was acknowledged, FIN too."""
    stream = conn._streams.get(stream_id)
    return stream is None or stream.sender.is_finished


def peer_close(conn: QuicConnection) -> events.ConnectionTerminated | None:
    """The peer's close, as soon as it arrived (aioquic says so only after draining)."""
    return conn._close_event


def host_connection_ids(conn: QuicConnection) -> list[bytes]:
    """Every connection id of ours the peer may address ``conn`` by."""
    return [c.cid for c in conn._host_cids]


def terminated(conn: QuicConnection) -> bool:
    """Whether ``conn`` is over: nothing more will be sent or received on it."""
    return conn._state.name == "TERMINATED"
