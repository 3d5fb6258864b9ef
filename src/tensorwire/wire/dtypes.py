"""The dtypes a message can carry, by the name that travels in the header."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tensorwire.errors import UnknownDtype

# Every dtype is little-endian on the wire; the name is what the header carries.
WIRE_DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype("<i1"),
    "int16": np.dtype("<i2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint8": np.dtype("<u1"),
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
    "uint64": np.dtype("<u8"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "complex64": np.dtype("<c8"),
    "complex128": np.dtype("<c16"),
}

_NAME_OF: dict[np.dtype, str] = {dtype: name for name, dtype in WIRE_DTYPES.items()}


def dtype_from_name(name: object) -> np.dtype:
    """Return the numpy dtype for a wire dtype name; raise ``UnknownDtype`` otherwise."""
    try:
        return WIRE_DTYPES[name]  # type: ignore[index]
    except (KeyError, TypeError):
        known = ", ".join(WIRE_DTYPES)
        raise UnknownDtype(f"unknown dtype {name!r}; this build reads: {known}") from None


def name_of_dtype(dtype: np.dtype) -> str:
    """Return the wire name of a (little-endian or native) numpy dtype; ``TypeError`` if none."""
    name = _NAME_OF.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
    if name is None:
        raise TypeError(f"dtype {dtype} cannot be sent; supported: {', '.join(WIRE_DTYPES)}")
    return name
