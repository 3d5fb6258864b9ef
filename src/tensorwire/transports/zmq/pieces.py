"""A tensorwire message as the pieces (ZeroMQ messages) it travels in: a marker, then its
bytes in order, small buffers joined and big ones zero-copy (see the package doc)."""

from __future__ import annotations

from collections.abc import Iterator

import zmq

from tensorwire.wire import EncodedMessage

PIECE_BYTES = 1 << 20  # payload of one ZeroMQ message: hashed and copied while still in cache
START, MORE = b"S", b"C"  # first frame of every ZeroMQ message: starts / continues a message
# Below it a frame is copied into libzmq's message (as pyzmq does with copy=False too): cheaper
# than a zero-copy frame, whose release goes through pyzmq's garbage-collector thread.
COPY_BYTES = zmq.COPY_THRESHOLD


def _batches(enc: EncodedMessage) -> Iterator[list[bytes | memoryview]]:
    """The message's bytes as lists of buffers of about ``PIECE_BYTES``, digests computed on the
    way (``segments``), buffers bigger than a piece sliced without copying."""
    for batch in enc.segments(PIECE_BYTES):
        if all(len(b) <= PIECE_BYTES for b in batch):
            yield batch
            continue
        for buf in batch:  # a big head, or a tensor whose digest an earlier send computed
            view = memoryview(buf)
            for start in range(0, len(view), PIECE_BYTES):
                yield [view[start : start + PIECE_BYTES]]


def _frames(marker: bytes, batch: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """``batch`` as frames: each buffer from pyzmq's copy threshold up zero-copy on its own,
    each run of smaller ones joined into one (pyzmq would copy them anyway), the marker first."""
    threshold = COPY_BYTES
    frames: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = [marker]
    for buf in batch:
        if len(buf) < threshold:
            run.append(buf)
            continue
        if run:
            frames.append(b"".join(run))
            run = []
        frames.append(buf)
    if run:
        frames.append(b"".join(run))
    return frames


def message_pieces(enc: EncodedMessage) -> Iterator[list[bytes | memoryview]]:
    """``enc`` as the frames of its ZeroMQ messages, in order (see the package doc)."""
    if enc.nbytes < COPY_BYTES:  # one frame, which libzmq copies: join it in one go
        yield [b"".join([START, *enc.frames()])]
        return
    marker = START
    for batch in _batches(enc):
        yield _frames(marker, batch)
        marker = MORE


class SharedPieces:
    """The pieces of one message, made on first use and kept for every client a broadcast
    sends them to: digests are computed and small buffers joined once."""

    def __init__(self, enc: EncodedMessage) -> None:
        self._source = message_pieces(enc)
        self._made: list[list[bytes | memoryview]] = []

    def get(self, i: int) -> list[bytes | memoryview] | None:
        """Piece ``i``, or None past the last one."""
        while i >= len(self._made):
            piece = next(self._source, None)
            if piece is None:
                return None
            self._made.append(piece)
        return self._made[i]
