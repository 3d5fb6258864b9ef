"""decode_partial: messages with lost byte ranges (best-effort datagrams)."""

from __future__ import annotations

import numpy as np
import pytest
from wire_helpers import lookup, zlib_chain

from tensorwire.errors import ChecksumMismatch, MalformedHeader, TruncatedMessage
from tensorwire.wire import ChunkReassembler, decode_message, encode_message, iter_chunks
from tensorwire.wire.format import DIGEST_SIZE
from tensorwire.wire.partial import decode_partial


def _encode(tensors, codecs=None, checksum=True):
    enc = encode_message(tensors, {"round": 4}, codecs=codecs, checksum=checksum)
    return enc, bytearray(enc.to_bytes())


def _spans(enc) -> list[tuple[int, int]]:
    """[start, end) of each tensor's encoded bytes in the message."""
    spans, at = [], len(enc.head)
    for buf in enc.buffers:
        spans.append((at, at + len(buf)))
        at += len(buf) + (DIGEST_SIZE if enc.digests else 0)
    return spans


def _lose(buf: bytearray, ranges) -> list[tuple[int, int]]:
    """Overwrite ``ranges`` with junk, as a receiver's uninitialised buffer would hold."""
    for offset, length in ranges:
        buf[offset : offset + length] = b"\xa5" * length
    return list(ranges)


def test_nothing_missing_is_a_normal_decode():
    tensors = {"a": np.arange(12.0).reshape(3, 4), "n": {"b": np.ones(5, np.int8)}}
    _, buf = _encode(tensors)
    msg, loss = decode_partial(buf, [])
    whole = decode_message(buf)
    assert loss == {"a": 0.0, "n/b": 0.0}
    assert msg.meta == whole.meta == {"round": 4} and msg.kind == "data"
    assert msg.nbytes == whole.nbytes and msg.n_tensors == 2
    assert np.array_equal(msg["a"], tensors["a"]) and np.array_equal(msg["n"]["b"], np.ones(5))


def test_raw_tensor_keeps_previous_values_in_lost_ranges():
    new = np.arange(1000, dtype=np.float32)
    enc, buf = _encode({"w": new})
    ((start, _),) = _spans(enc)
    missing = _lose(buf, [(start + 400, 400), (start + 2000, 100)])  # floats 100..199, 500..524
    previous = np.full(1000, -1.0, np.float32)
    msg, loss = decode_partial(buf, missing, out={("w",): previous})
    assert msg["w"] is previous
    expected = new.copy()
    expected[100:200] = -1.0
    expected[500:525] = -1.0
    assert np.array_equal(previous, expected)  # and no ChecksumMismatch: its check is skipped
    assert loss == {"w": pytest.approx(500 / 4000)}


def test_raw_tensor_without_previous_values_reads_zero_where_lost():
    new = np.arange(1, 101, dtype=np.int64)
    enc, buf = _encode({"w": new, "other": np.ones(3)})
    (start, _), _ = _spans(enc)
    missing = _lose(buf, [(start, 80)])  # the first ten values
    msg, loss = decode_partial(buf, missing, out={("other",): np.zeros(2)})  # no "w"; bad shape
    assert np.array_equal(msg["w"][:10], np.zeros(10)) and np.array_equal(msg["w"][10:], new[10:])
    assert np.array_equal(msg["other"], np.ones(3))
    assert loss == {"w": 0.1, "other": 0.0}


def test_fortran_order_tensor_loses_its_memory_order_range():
    new = np.asfortranarray(np.arange(24, dtype=np.int32).reshape(4, 6))
    enc, buf = _encode({"f": new})
    ((start, _),) = _spans(enc)
    missing = _lose(buf, [(start + 16, 16)])  # the second column, in Fortran order
    previous = np.asfortranarray(np.full((4, 6), 99, np.int32))
    msg, loss = decode_partial(buf, missing, out={("f",): previous})
    expected = new.copy(order="F")
    expected[:, 1] = 99
    assert msg["f"] is previous and np.array_equal(previous, expected)
    assert loss == {"f": pytest.approx(1 / 6)}


def test_compressed_tensor_partly_lost_keeps_previous_values_entirely():
    new = {"z": np.zeros(10_000, np.float64), "r": np.arange(4.0)}
    enc, buf = _encode(new, codecs=zlib_chain)
    z, _ = _spans(enc)
    assert z[1] - z[0] < new["z"].nbytes  # it is compressed
    missing = _lose(buf, [(z[0] + 1, 1)])
    previous = np.full(10_000, 7.0)
    msg, loss = decode_partial(buf, missing, out={("z",): previous}, codec_lookup=lookup)
    assert msg["z"] is previous and (previous == 7.0).all()
    assert np.array_equal(msg["r"], np.arange(4.0))
    assert loss == {"z": 1.0, "r": 0.0}
    # without previous values, a lost compressed tensor reads zero
    msg, loss = decode_partial(buf, missing, codec_lookup=lookup)
    assert (msg["z"] == 0).all() and loss["z"] == 1.0


def test_whole_tensors_are_still_checksummed():
    enc, buf = _encode({"a": np.arange(100.0), "b": np.arange(100.0)})
    a, b = _spans(enc)
    buf[a[0] + 3] ^= 0xFF  # corrupt a received tensor
    missing = _lose(buf, [(b[0], 8)])
    with pytest.raises(ChecksumMismatch):
        decode_partial(buf, missing)


def test_whole_tensor_whose_digest_was_lost_is_taken_unchecked():
    enc, buf = _encode({"a": np.arange(100.0)})
    ((_, end),) = _spans(enc)
    missing = _lose(buf, [(end, DIGEST_SIZE)])
    msg, loss = decode_partial(buf, missing)
    assert np.array_equal(msg["a"], np.arange(100.0)) and loss == {"a": 0.0}


@pytest.mark.parametrize("lost", [(0, 1), (23, 1), (24, 1), ("header_end", 1)])
def test_lost_prefix_or_header_loses_the_message(lost):
    enc, buf = _encode({"a": np.arange(10.0)})
    offset = len(enc.head) - 1 if lost[0] == "header_end" else lost[0]
    with pytest.raises(TruncatedMessage, match="lost"):
        decode_partial(buf, _lose(buf, [(offset, lost[1])]))


def test_buffer_of_the_wrong_length_is_malformed():
    _, buf = _encode({"a": np.arange(10.0)})
    with pytest.raises(MalformedHeader):
        decode_partial(buf + b"\0", [])
    with pytest.raises(TruncatedMessage):
        decode_partial(buf[:10], [])


def test_overlapping_and_unsorted_ranges_are_counted_once():
    enc, buf = _encode({"w": np.zeros(100, np.uint8)}, checksum=False)
    ((start, _),) = _spans(enc)
    missing = [(start + 50, 20), (start + 10, 10), (start + 55, 5), (start + 15, 10)]
    _, loss = decode_partial(buf, missing)
    assert loss == {"w": pytest.approx((15 + 20) / 100)}


def test_from_a_reassembler_that_lost_chunks():
    new = {"w": (np.arange(20_000) % 251).astype(np.uint8), "s": np.array(3)}
    enc = encode_message(new)
    chunks = [b"".join(bytes(p) for p in c) for c in iter_chunks(enc.frames(), 9, 1000)]
    r = ChunkReassembler(timeout=1.0)
    for i, chunk in enumerate(chunks):
        if i not in (4, 11):
            assert r.feed(chunk, now=0.0) is None
    (partial,) = r.expire(now=5.0)
    assert partial.missing == [(4000, 1000), (11_000, 1000)]
    previous = np.full(20_000, 255, np.uint8)
    msg, loss = decode_partial(partial.data, partial.missing, out={("w",): previous})
    kept = previous == 255
    assert kept.sum() == 2000 and np.array_equal(previous[~kept], new["w"][~kept])
    assert loss == {"w": 0.1, "s": 0.0} and msg["s"] == 3
