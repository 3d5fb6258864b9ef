"""Building the header map: the reference layout's bytes, joined without a map where they repeat."""

from __future__ import annotations

import struct
from typing import Any

from tensorwire.wire.plans import pack

_KIND_KEY, _META_KEY, _TENSORS_KEY, _T0_KEY = (pack(k) for k in ("kind", "meta", "tensors", "t0"))


def build_header(
    kind: str, meta: dict[str, Any], t0: float | None, tensors: list[dict[str, Any]]
) -> bytes:
    """Pack the header map; ``meta`` must hold only msgpack types (numpy scalars allowed)."""
    try:
        packed = pack(tensors)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"a tensor entry cannot be packed: {exc}") from None
    return assemble_header(kind, meta, t0, packed)


_HEAD_STARTS: dict[str, bytes] = {}  # kind -> the header's bytes up to its tensors, no meta
_MAX_HEAD_STARTS = 16
_T0_F64 = struct.Struct(">Bd")  # msgpack's float 64: 0xcb, then the value big-endian


def assemble_header(kind: str, meta: dict[str, Any], t0: float | None, tensors: bytes) -> bytes:
    """The header map around an already packed ``tensors`` array: the same bytes as packing
    ``{"kind", "meta", "tensors"[, "t0"]}`` in that order (section 4.1's reference layout)."""
    if not meta and type(t0) is float and type(kind) is str:  # most messages: bytes joined
        start = _HEAD_STARTS.get(kind)
        if start is None:
            start = b"\x84" + _KIND_KEY + pack(kind) + _META_KEY + b"\x80" + _TENSORS_KEY
            if len(_HEAD_STARTS) < _MAX_HEAD_STARTS:
                _HEAD_STARTS[kind] = start
        return b"".join((start, tensors, _T0_KEY, _T0_F64.pack(0xCB, t0)))
    _check_str_keys(meta, "meta")
    try:
        parts = [
            b"\x84" if t0 is not None else b"\x83",
            _KIND_KEY,
            pack(kind),
            _META_KEY,
            pack(meta),
            _TENSORS_KEY,
            tensors,
        ]
        if t0 is not None:
            parts += (_T0_KEY, pack(t0))
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"meta cannot be sent: {exc} (use str, int, float, bool, bytes, lists, dicts)"
        ) from None
    return b"".join(parts)


def _check_str_keys(obj: Any, where: str) -> None:
    """Decoders accept only string map keys (msgpack's strict_map_key): refuse others here."""
    if type(obj) is dict:  # the common meta: str keys to scalars or lists of scalars
        for key, value in obj.items():
            kind = type(value)
            if type(key) is not str or (
                kind not in _SCALARS
                and not (kind in _SEQUENCES and all(type(v) in _SCALARS for v in value))
            ):
                break
        else:
            return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r}; map keys in meta must be str")
            if isinstance(value, _CONTAINERS):
                _check_str_keys(value, f"{where}.{key}")
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            if isinstance(value, _CONTAINERS):
                _check_str_keys(value, where)


_CONTAINERS = (dict, list, tuple)
_SEQUENCES = frozenset((list, tuple))
_SCALARS = frozenset((str, int, float, bool, bytes, type(None)))
