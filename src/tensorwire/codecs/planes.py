"""Byte planes of fixed-size elements: the transform under the ``floatplanes`` codec.

Each element (an unsigned little-endian integer of ``typesize`` bytes: a float's bits) is
rotated left by one bit, which moves the sign from the top bit to the bottom one, so that
the top byte of a float32, bfloat16 or float64 holds exponent bits only. Plane ``k`` then
holds byte ``k`` (least significant first) of every rotated element. Exponent planes of
trained weights are highly skewed; mantissa planes are close to random.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TYPESIZES = (1, 2, 4, 8)
"""Element sizes in bytes the transform knows (1: bytes as they are, one plane)."""


def _words(buf: memoryview, typesize: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=f"<u{typesize}")


def split_planes(block: memoryview, typesize: int) -> np.ndarray:
    """Return a new ``(typesize, n)`` uint8 array: the planes of ``block``'s ``n`` elements.

    ``len(block)`` must be a multiple of ``typesize``.
    """
    if typesize == 1:
        return np.frombuffer(block, dtype=np.uint8).reshape(1, -1).copy()
    words = _words(block, typesize)
    planes = np.empty((typesize, words.size), dtype=np.uint8)
    # Byte k of the rotated element is bits 8k-1 .. 8k+6 of the element (byte 0: its top
    # bit, then bits 0 .. 6): shifts that truncate into each plane, no rotated copy. Plane 1
    # holds the top bit until plane 0 has taken it.
    np.right_shift(words, 8 * typesize - 1, out=planes[1], casting="unsafe")
    np.left_shift(words, 1, out=planes[0], casting="unsafe")
    planes[0] |= planes[1]
    for k in range(1, typesize):
        np.right_shift(words, 8 * k - 1, out=planes[k], casting="unsafe")
    return planes


def merge_planes(planes: Sequence[np.ndarray], dst: memoryview, typesize: int) -> None:
    """Write the elements whose planes are ``planes`` (``typesize`` uint8 arrays of ``n``)
    into ``dst`` (``n * typesize`` writable bytes): the inverse of :func:`split_planes`."""
    if typesize == 1:
        np.frombuffer(dst, dtype=np.uint8)[:] = planes[0]
        return
    out = _words(dst, typesize)
    eight = np.uint8(8)
    out[:] = planes[typesize - 1]
    for k in range(typesize - 2, -1, -1):  # Horner: out = out << 8 | plane k
        out <<= eight
        out |= planes[k]
    sign = out << np.uint8(8 * typesize - 1)  # rotate right by one bit
    out >>= np.uint8(1)
    out |= sign
