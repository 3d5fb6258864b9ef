"""Tensorwire messages back from the pieces one peer sent (see the package doc)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import zmq

from tensorwire.codecs import get_codec
from tensorwire.errors import BadMagic, TruncatedMessage, WireError
from tensorwire.transports.zmq.pieces import MORE, START
from tensorwire.wire import NEED_DATA, Limits, Message, MessageStream


class Reassembler:
    """Tensorwire messages back from the ZeroMQ messages one peer sent (see the package doc)."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._stream = self._new_stream()

    def _new_stream(self) -> MessageStream:
        return MessageStream(limits=self._limits, codec_lookup=get_codec)

    def set_limits(self, limits: Limits) -> None:
        """Read the messages after the current one under ``limits`` (a stranger became a member)."""
        self._limits = self._stream.limits = limits

    @property
    def in_message(self) -> bool:
        """True while a message is partly received."""
        return self._stream.in_message

    def feed(
        self, frames: list[zmq.Frame], out: Mapping[Any, Any] | None = None
    ) -> list[Message | WireError]:
        """Take one ZeroMQ message; return the messages it completes and the errors it raised.

        ``out`` (arrays by name path) is used when this ZeroMQ message starts a new one.
        """
        events: list[Message | WireError] = []
        head = frames[0].buffer
        marker = head[:1]
        if marker == START:
            if self._stream.in_message:
                events.append(
                    TruncatedMessage("a message was cut short: the sender started the next one")
                )
                self._stream = self._new_stream()
            self._stream.set_out(out)
        elif marker == MORE:
            if not self._stream.in_message:
                return events  # the rest of a message whose framing was already lost
        else:
            return [
                BadMagic(
                    f"a ZeroMQ message starting {bytes(head[:8])!r} is not part of a tensorwire "
                    "message (no segment marker)"
                )
            ]
        stream = self._stream
        try:
            if len(frames) == 1 and marker == START:  # most likely a whole small message
                msg = stream.receive_one(head[1:])
                if msg is not None:
                    if events:
                        events.append(msg)
                        return events
                    return [msg]
            else:
                step = stream.max_read
                for view in (head[1:], *(f.buffer for f in frames[1:])):
                    for start in range(0, len(view), step):
                        stream.receive_data(view[start : start + step])
        except WireError as exc:  # framing lost: drop this message, resume at the next START
            self._stream = self._new_stream()
            events.append(exc)
            return events
        while True:
            try:
                event = stream.next_event()
            except WireError as exc:  # a bad message the stream skipped to its end
                events.append(exc)
                continue
            if event is NEED_DATA:
                return events
            events.append(event)
