"""How tests/wire/make_vectors.py writes a vector: the ``Writer`` that encodes or takes each
message, stores its file and its index.json entry, and the helpers it shares with the
vector makers (tests/wire/make_vectors.py says what the vectors are)."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import msgpack
import numpy as np

from tensorwire.wire import WIRE_DTYPES, decode_message, encode_message, iter_chunks
from tensorwire.wire.format import PREFIX_SIZE, pack_prefix
from tensorwire.wire.tensors import flatten

OUT = Path(__file__).resolve().parent / "vectors"
T0 = 1700000000.5
MESSAGE_ID = 0x0123456789ABCDEF
CHUNK_PAYLOAD = 128


def array(dtype: str, values: list[Any], shape: tuple[int, ...], order: str = "C") -> np.ndarray:
    if dtype.startswith("complex"):
        values = [complex(re, im) for re, im in values]
    flat = np.array(values, dtype=WIRE_DTYPES[dtype])
    return flat.reshape(shape, order=order)


def describe_tensor(path: tuple[str, ...], arr: np.ndarray) -> dict[str, Any]:
    order = "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    flat = arr.reshape(-1, order=order)
    dtype = next(name for name, dt in WIRE_DTYPES.items() if dt == arr.dtype)
    if dtype.startswith("complex"):
        values: list[Any] = [[float(v.real), float(v.imag)] for v in flat]
    elif arr.dtype == np.dtype(ml_dtypes.bfloat16):
        values = [float(v) for v in flat.astype(np.float32)]
    else:
        values = flat.tolist()
    return {
        "name": list(path),
        "dtype": dtype,
        "shape": list(arr.shape),
        "order": order,
        "data_base64": base64.b64encode(flat.tobytes()).decode(),
        "values": values,
    }


class Writer:
    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        OUT.mkdir(exist_ok=True)
        for old in OUT.glob("*.bin"):
            old.unlink()

    def save(self, file: str, data: bytes) -> bytes:
        (OUT / file).write_bytes(data)
        return data

    def message(
        self,
        file: str,
        description: str,
        tensors: dict[str, Any],
        meta: dict[str, Any],
        *,
        checksum: bool = True,
        kind: str = "data",
        codecs: dict[str, list[dict[str, Any]]] | None = None,
    ) -> bytes:
        selector = None
        if codecs:
            from tensorwire.codecs import get_codec

            def selector(name: str, arr: np.ndarray) -> list[Any]:
                return [get_codec(c) for c in codecs.get(name, [])]

        enc = encode_message(tensors, meta, checksum=checksum, kind=kind, t0=T0, codecs=selector)
        data = self.save(file, enc.to_bytes())
        listed = list(flatten(tensors))
        if codecs:
            listed = self.decoded(data, listed, codecs)
        self.entries.append(
            {
                "type": "message",
                "file": file,
                "description": description,
                "encode": {"checksum": checksum, "kind": kind, "t0": T0, "codecs": codecs},
                "exact_reencode": not codecs,
                "needs_codecs": bool(codecs),
                "kind": kind,
                "t0": T0,
                "meta": meta,
                "tensors": [describe_tensor(p, np.asarray(a)) for p, a in listed],
            }
        )
        return data

    @staticmethod
    def decoded(
        data: bytes, listed: list[tuple[tuple[str, ...], Any]], codecs: dict[str, list[Any]]
    ) -> list[tuple[tuple[str, ...], np.ndarray]]:
        """The tensors as the reference decoder reads ``data`` back (what a lossy vector pins);
        checks that every chain in ``codecs`` was kept and that lossless ones round-trip."""
        from tensorwire.codecs import LOSSY_CODECS, get_codec

        hlen = struct.unpack_from("<I", data, 8)[0]
        header = msgpack.unpackb(data[PREFIX_SIZE : PREFIX_SIZE + hlen])
        kept = {"/".join(e["name"]): e.get("codecs", []) for e in header["tensors"]}
        for name, chain in codecs.items():
            if [c["id"] for c in kept[name]] != [c["id"] for c in chain]:
                raise AssertionError(f"the encoder did not keep {name!r}'s codec chain {chain}")
        got = dict(flatten(decode_message(data, codec_lookup=get_codec).tensors))
        out = []
        for path, arr in listed:
            dec = got[path]
            lossy = any(c["id"] in LOSSY_CODECS for c in kept["/".join(path)])
            if not lossy:
                want = np.asarray(arr)
                assert dec.dtype == want.dtype and dec.shape == want.shape
                assert dec.tobytes(order="A") == want.tobytes(order="A")
            out.append((path, dec))
        return out

    def error(
        self, file: str, description: str, data: bytes, error: str, needs_codecs: bool = False
    ) -> None:
        self.save(file, data)
        self.entries.append(
            {
                "type": "error",
                "file": file,
                "description": description,
                "error": error,
                "needs_codecs": needs_codecs,
            }
        )

    def chunks(self, stem: str, description: str, message_file: str, data: bytes) -> None:
        files = []
        for i, parts in enumerate(iter_chunks([data], MESSAGE_ID, CHUNK_PAYLOAD)):
            files.append(f"{stem}.{i}.bin")
            self.save(files[-1], b"".join(bytes(p) for p in parts))
        self.entries.append(
            {
                "type": "chunks",
                "description": description,
                "message_file": message_file,
                "message_id": MESSAGE_ID,
                "chunk_payload": CHUNK_PAYLOAD,
                "chunks": files,
            }
        )

    def finish(self) -> None:
        index = {
            "format": "tensorwire wire format version 1 test vectors; see docs/wire-format.md",
            "generator": "tests/wire/make_vectors.py",
            "vectors": self.entries,
        }
        (OUT / "index.json").write_text(to_json(index) + "\n", encoding="utf-8")


def to_json(obj: Any, level: int = 0) -> str:
    """JSON with short containers and lists of numbers on one line (a readable diff)."""
    one_line = json.dumps(obj, ensure_ascii=False)
    flat_list = isinstance(obj, list) and not any(isinstance(v, (dict, list)) for v in obj)
    if len(one_line) <= 90 or flat_list or not isinstance(obj, (dict, list)):
        return one_line
    pad = "  " * (level + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k)}: {to_json(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * level + "}"
    items = [pad + to_json(v, level + 1) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + "  " * level + "]"


def with_header(doc: dict[str, Any], body: bytes, digests: bool) -> bytes:
    """A message from a hand-written header map (the header check is correct)."""
    header = msgpack.packb(doc, use_bin_type=True)
    return pack_prefix(header, len(body), digests) + header + body
