"""What hubs and channels share: codec policy, limits, encoding for a peer, records."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from tensorwire.codecs import AutoCodec, available_codecs, get_codec, resolve_codecs
from tensorwire.errors import MessageTooLarge
from tensorwire.transports.base.negotiation import _MAX_DECODER_SETS, _DecodableCodecs, _raw_below
from tensorwire.transports.base.records import ErrorLog, RecordLog, TransferRecord
from tensorwire.transports.base.send_time import SendTime
from tensorwire.transports.streams import AckBook
from tensorwire.wire import (
    CodecSelector,
    EncodedMessage,
    Limits,
    Message,
    decode_message,
    encode_message,
)

LINK_SAMPLE_BYTES = 1 << 20
"""Sends at least this big tell an ``auto`` selector the link's rate."""
CPU_BOUND_FLOOR = 0.02
"""A send's link seconds count as at least this fraction of its wall seconds: one whose
thread was never blocked (CPU-bound) reads as a link 50 times its throughput, not infinite."""


class _Endpoint:
    """Codec policy, limits and records shared by hubs and channels."""

    protocol = "?"
    link_timed_by_acks = False
    """True where a send returns long before its bytes cross the link (quic hands a message to
    its connection up to megabytes ahead): the transport then times each big message until
    the peer acknowledged it, and tells :meth:`_note_link`."""

    def __init__(self, codec: Any, checksum: bool, limits: Limits) -> None:
        self.codec_spec = codec
        self.selector: CodecSelector = resolve_codecs(codec)
        # (selector, raw_below, codecs kept to what the peer decodes) by the peer's decoders
        self._codecs_for: dict[frozenset[str], tuple[Any, float, Any]] = {}
        self.checksum = checksum
        self.limits = limits
        self.records = RecordLog()
        self.errors = ErrorLog()
        self.decoders = available_codecs()
        self._acks = AckBook()
        # a channel's messages that came while a stream waited for acknowledgements
        self._stream_held: deque[Message] = deque()

    def set_codec(self, codec: Any) -> None:
        """Use ``codec`` (anything ``codec=`` takes) for the messages sent from now on."""
        self.codec_spec = codec
        self.selector = resolve_codecs(codec)

    def _encode_for(
        self,
        tensors: Mapping[str, Any] | None,
        meta: Mapping[str, Any] | None,
        peer_decoders: frozenset[str],
        kind: str = "data",
        peer_max_bytes: int | None = None,
        peer: str = "the peer",
        client: str | None = None,
    ) -> EncodedMessage:
        """Encode with this endpoint's codecs, keeping to those the peer can decode; a message
        larger than the peer accepts raises :class:`MessageTooLarge` here, at the sender."""
        selector = self.selector
        chosen = self._codecs_for.get(peer_decoders)
        if chosen is None or chosen[0] is not selector:
            # codec=None: nothing to choose per tensor (half the cost of encoding a stream
            # batch); tensors under the selector's min_size go raw without asking it
            raw_below = _raw_below(selector)
            allowed = None if raw_below == math.inf else _DecodableCodecs(selector, peer_decoders)
            if len(self._codecs_for) >= _MAX_DECODER_SETS:  # peers choose them: bounded
                self._codecs_for.clear()
            chosen = self._codecs_for[peer_decoders] = (selector, raw_below, allowed)
        _, raw_below, allowed = chosen
        enc = encode_message(
            tensors, meta, codecs=allowed, checksum=self.checksum, kind=kind, raw_below=raw_below
        )
        if peer_max_bytes is not None and enc.nbytes > peer_max_bytes:
            raise MessageTooLarge(
                f"a message of {enc.nbytes} bytes is over the {peer_max_bytes} bytes "
                f"{peer if client is None else f'client {client!r}'} "
                "accepts (its Limits.max_message_bytes): send less, or raise its limit"
            )
        return enc

    def _measures_link(self, enc: EncodedMessage) -> bool:
        """Whether sending ``enc`` should measure the link (for an ``auto`` selector)."""
        return (
            not self.link_timed_by_acks
            and isinstance(self.selector, AutoCodec)
            and enc.nbytes >= LINK_SAMPLE_BYTES
        )

    def _note_link(self, nbytes: int, seconds: float) -> None:
        """A message of ``nbytes`` crossed the link in ``seconds`` (sent until acknowledged):
        a big one tells an ``auto`` selector the link's rate."""
        selector = self.selector
        if isinstance(selector, AutoCodec) and nbytes >= LINK_SAMPLE_BYTES and seconds > 0:
            selector.update_bandwidth(nbytes / seconds)

    def _note_send(
        self, peer: str, enc: EncodedMessage, sent: SendTime | float, started: float
    ) -> TransferRecord:
        """Record a send of ``enc`` (its wall seconds, or a :class:`SendTime`); a big one tells
        an ``auto`` selector the link's rate: bytes over the seconds the sending thread was
        blocked when measured (see :mod:`~tensorwire.transports.base.send_time`), else the
        wall seconds."""
        wire_s, link_s = sent if isinstance(sent, SendTime) else (sent, None)
        if not self.link_timed_by_acks:
            seconds = wire_s if link_s is None else max(link_s, CPU_BOUND_FLOOR * wire_s)
            self._note_link(enc.nbytes, seconds)
        values = (  # TransferRecord's fields, in order (positional: cheaper per message)
            "send",
            peer,
            self.protocol,
            "data",
            len(enc.buffers),
            enc.raw_nbytes,
            enc.nbytes,
            enc.codec_label,
            enc.encode_s,
            wire_s,
            0.0,
            time.perf_counter() - started,
            None,
            enc.t0,
        )
        rec = TransferRecord(*values)
        self.records.add(rec, values)
        return rec

    def _decode_whole(self, buf: Any, first_byte_at: float, out: Any = None) -> Message:
        """Decode a message a transport received whole (or reassembled from chunks).

        ``first_byte_at`` is ``time.perf_counter()`` when its first byte (or chunk) arrived.
        Raw tensors stay views of a writable ``buf`` unless ``out`` holds arrays for them; a
        read-only ``buf`` (a library's ``bytes``) is copied from once, so the caller gets
        arrays it can change and decode into again.
        """
        copy = memoryview(buf).readonly
        msg = decode_message(buf, limits=self.limits, codec_lookup=get_codec, out=out, copy=copy)
        msg.recv_s = time.perf_counter() - first_byte_at
        return msg

    def _note_recv(self, peer: str, msg: Message) -> TransferRecord:
        now = time.time()
        values = (  # TransferRecord's fields, in order
            "recv",
            peer,
            self.protocol,
            msg.kind,
            msg.n_tensors,
            msg.nbytes,
            msg.wire_nbytes,
            msg.codec_label,
            0.0,
            max(msg.recv_s - msg.decode_s, 0.0),
            msg.decode_s,
            msg.recv_s,
            (now - msg.t0) if msg.t0 is not None else None,
            now - msg.recv_s,
        )
        rec = TransferRecord(*values)
        self.records.add(rec, values)
        msg.record = rec
        return rec


def _out_by_path(out: Mapping[Any, Any] | None) -> dict[tuple[str, ...], Any] | None:
    """Accept ``out`` as a nested mapping, a flat mapping of "a/b" names, or of path tuples."""
    if out is None:
        return None
    flat: dict[tuple[str, ...], Any] = {}
    if type(out) is dict:  # the common case, a message's own tensors: no walk
        for key, value in out.items():
            if type(value) is not np.ndarray or type(key) is not str:
                flat.clear()
                break
            flat[(key,)] = value
        else:
            return flat

    def walk(node: Mapping[Any, Any], prefix: tuple[str, ...]) -> None:
        for key, value in node.items():
            path = key if isinstance(key, tuple) else (*prefix, key)
            if isinstance(value, Mapping):
                walk(value, path)
            else:
                flat[path] = value

    walk(out, ())
    return flat
