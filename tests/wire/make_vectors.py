"""Write the wire-format test vectors: tests/wire/vectors/*.bin and vectors/index.json.

Run by hand from the repository root after a deliberate change to the wire format:

    .venv/bin/python tests/wire/make_vectors.py

then review the diff of tests/wire/vectors/ and update the hex dumps in
docs/wire-format.md if the bytes they show changed. Output is deterministic (the header's
``t0`` is fixed). ``tests/wire/test_vectors.py`` decodes every vector, compares it with
index.json and re-encodes the valid uncompressed ones byte for byte.

index.json lists one entry per vector, with ``type``:

- ``"message"``: ``file`` decodes to ``kind``, ``t0``, ``meta`` and ``tensors`` (each with
  ``name`` path, ``dtype``, ``shape``, ``order``, ``data_base64`` = the tensor's raw
  little-endian bytes in ``order``'s memory order, and ``values``, the same elements as a
  flat JSON list in that order; complex elements are ``[real, imag]``). ``encode`` holds
  the encoder options that made the file (``codecs``: each tensor's codec chain, as the
  configs that travel in the header); ``exact_reencode`` says whether they must reproduce
  it (compressed payloads may differ between compressor versions, so those are not).
  With a lossy codec in a chain, the tensors listed are what decoding the file gives, not
  what was encoded: such a vector pins decoding.
- ``"error"``: decoding ``file`` raises the ``tensorwire.errors`` class named ``error``.
- ``"chunks"``: the ``chunks`` files are ``message_file`` cut with ``chunk_payload``
  bytes per chunk and ``message_id``.

``needs_codecs`` (messages and errors): decode with the codec registry
(``tensorwire.codecs.get_codec``).
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
from vector_codecs import codec_vectors
from vector_writer import OUT, Writer, array, with_header

from tensorwire.wire.format import PREFIX_SIZE

DTYPE_VALUES: dict[str, list[Any]] = {
    "bool": [True, False, True],
    "int8": [-128, 0, 127],
    "int16": [-32768, 1, 32767],
    "int32": [-(2**31), 2, 2**31 - 1],
    "int64": [-(2**63), 3, 2**63 - 1],
    "uint8": [0, 1, 255],
    "uint16": [0, 258, 65535],
    "uint32": [0, 16909060, 2**32 - 1],
    "uint64": [0, 72623859790382856, 2**64 - 1],
    "float16": [1.0, -2.0, 65504.0],
    "bfloat16": [1.0, -2.0, 3.140625],
    "float32": [1.0, -0.5, 3.25],
    "float64": [1.0, -0.5, 1e300],
    "complex64": [[1.0, -1.0], [0.5, 2.0], [0.0, 0.0]],
    "complex128": [[1.0, -1.0], [0.5, 2.0], [-3.0, 1e-300]],
}


def main() -> None:
    w = Writer()
    w.message(
        "empty_meta_only.bin",
        "no tensors, metadata only, digests flag set",
        {},
        {"round": 0, "client": "server"},
    )
    f32 = array("float32", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], (2, 3))
    good = w.message(
        "float32_2x3.bin", "one float32 tensor 'x' of shape [2, 3], C order", {"x": f32}, {}
    )
    w.message(
        "all_dtypes.bin",
        "one 3-element tensor per wire dtype, named after it",
        {name: array(name, values, (3,)) for name, values in DTYPE_VALUES.items()},
        {},
    )
    w.message(
        "zero_d_and_empty.bin",
        "a 0-d float64 scalar and int32 tensors of shapes [0, 3] and [0]",
        {
            "scalar": array("float64", [2.5], ()),
            "empty": array("int32", [], (0, 3)),
            "nothing": array("uint8", [], (0,)),
        },
        {},
    )
    w.message(
        "fortran_order.bin",
        "int16 [2, 3] in Fortran (column-major) order: bytes are 1 4 2 5 3 6",
        {"f": array("int16", [1, 4, 2, 5, 3, 6], (2, 3), order="F")},
        {},
    )
    w.message(
        "nested_names.bin",
        "nested tensor names and nested metadata, kind 'update'",
        {
            "weights": {
                "conv1": {
                    "weight": array("float32", [0.5, -0.5, 0.25, -0.25], (1, 1, 2, 2)),
                    "bias": array("float32", [0.125], (1,)),
                },
                "bn": {"num_batches_tracked": array("int64", [7], ())},
            },
            "step": array("uint32", [3], ()),
        },
        {
            "round": 3,
            "client": "dev-1",
            "samples": 12500,
            "lr": 0.05,
            "shape": [2, [3, 4]],
            "opts": {"momentum": 0.9, "nesterov": False, "note": None},
        },
        kind="update",
    )
    w.message(
        "no_digests.bin",
        "float32 [2, 3] without per-tensor digests (flags = 0)",
        {"x": f32},
        {},
        checksum=False,
    )
    chunked = w.message(
        "chunked_message.bin",
        "a message that the 'chunks' vector cuts into 128-byte chunk payloads",
        {"w": np.arange(64, dtype=np.float32)},
        {"round": 1},
    )
    w.chunks(
        "chunked_message.chunk",
        "chunked_message.bin in chunks of 128 payload bytes, message id 0x0123456789abcdef",
        "chunked_message.bin",
        chunked,
    )

    try:
        import tensorwire.codecs  # noqa: F401
    except ImportError:
        have_codecs = False
        print("tensorwire.codecs is not importable: no compressed vectors")
    else:
        have_codecs = True
        pattern = np.tile(np.arange(16, dtype=np.float32), 64).reshape(32, 32)
        for codec in ("lz4", "zstd"):
            w.message(
                f"{codec}_compressed.bin",
                f"float32 [32, 32] (0..15 repeated) compressed with {codec}, and a raw tensor",
                {"z": pattern, "raw": array("uint8", [1, 2, 3], (3,))},
                {},
                codecs={"z": [{"id": codec, "block_size": 65536}]},
            )
        lz4 = (OUT / "lz4_compressed.bin").read_bytes()
        hlen = struct.unpack_from("<I", lz4, 8)[0]
        doc = msgpack.unpackb(lz4[PREFIX_SIZE : PREFIX_SIZE + hlen])
        doc["tensors"][0]["shape"] = [32, 31]
        doc["tensors"][0]["nbytes"] = 32 * 31 * 4
        w.error(
            "decompressed_size_mismatch.bin",
            "lz4_compressed.bin with tensor 'z' declared as [32, 31]: the payload holds 4096 bytes",
            with_header(doc, lz4[PREFIX_SIZE + hlen :], digests=True),
            "DecompressedSizeMismatch",
            needs_codecs=True,
        )

    hlen = struct.unpack_from("<I", good, 8)[0]
    header = good[PREFIX_SIZE : PREFIX_SIZE + hlen]
    w.error("bad_magic.bin", "float32_2x3.bin with magic 'TWIX'", b"TWIX" + good[4:], "BadMagic")
    w.error(
        "bad_version.bin",
        "float32_2x3.bin with version byte 2",
        good[:4] + b"\x02" + good[5:],
        "UnsupportedVersion",
    )
    flipped = bytearray(good)
    flipped[PREFIX_SIZE + hlen] ^= 0x01
    w.error(
        "checksum_mismatch.bin",
        "float32_2x3.bin with the first data byte changed (digest unchanged)",
        bytes(flipped),
        "ChecksumMismatch",
    )
    flipped = bytearray(good)
    flipped[PREFIX_SIZE + 4] ^= 0x01
    w.error(
        "header_check_mismatch.bin",
        "float32_2x3.bin with one header byte changed (header_check unchanged)",
        bytes(flipped),
        "HeaderCheckMismatch",
    )
    w.error(
        "truncated.bin", "float32_2x3.bin without its last 3 bytes", good[:-3], "TruncatedMessage"
    )
    doc = msgpack.unpackb(header)
    entry = doc["tensors"][0]
    w.error(
        "shape_mismatch.bin",
        "tensor 'x' declares shape [2, 3] float32 (24 bytes) but nbytes and size 20",
        with_header(
            {**doc, "tensors": [{**entry, "nbytes": 20, "size": 20}]},
            bytes(f32.tobytes()[:20]) + bytes(8),
            digests=True,
        ),
        "ShapeMismatch",
    )
    w.error(
        "unknown_dtype.bin",
        "tensor 'x' with dtype 'float8_e4m3' (not a wire dtype)",
        with_header(
            {**doc, "tensors": [{**entry, "dtype": "float8_e4m3", "nbytes": 6, "size": 6}]},
            bytes(6),
            digests=False,
        ),
        "UnknownDtype",
    )
    w.error(
        "unknown_codec.bin",
        "tensor 'x' with codec chain [{'id': 'snappy'}]",
        with_header(
            {**doc, "tensors": [{**entry, "codecs": [{"id": "snappy"}], "size": 4}]},
            b"abcd",
            digests=False,
        ),
        "UnknownCodec",
        needs_codecs=True,
    )
    if have_codecs:
        codec_vectors(w)
    w.finish()
    print(f"wrote {len(w.entries)} vectors to {OUT}")


if __name__ == "__main__":
    main()
