"""A decoded message, and the event that says none is complete yet."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from tensorwire.wire.plans import TensorTable
from tensorwire.wire.tensors import map_leaves, to_torch, unflatten


# A one-member enum, so that ``event is NEED_DATA`` narrows ``event`` for type checkers.
class _NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"

    __str__ = __repr__


NEED_DATA: Final = _NeedData.NEED_DATA
"""Returned by ``MessageStream.next_event`` when no complete message is buffered."""


@dataclass(eq=False)
class Message(Mapping[str, Any]):
    """A decoded message: nested ``tensors`` (numpy arrays) and ``meta``.

    A message is a read-only mapping of its top-level names to its tensors (or to dicts of
    them, for nested names): ``msg["x"]``, ``"x" in msg``, ``len(msg)``, ``dict(msg)``,
    ``msg.keys()``, iteration. ``decode_s`` is the CPU time spent decoding (header,
    checksums, codecs), seconds; ``recv_s`` the time from its first byte arriving to its
    last tensor decoded, seconds (0 for :func:`decode_message`); ``t0`` the sender's clock
    when it began encoding.
    """

    tensors: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    kind: str = "data"
    t0: float | None = None
    nbytes: int = 0
    wire_nbytes: int = 0
    decode_s: float = 0.0
    recv_s: float = 0.0
    n_tensors: int = 0
    codec_label: str = "raw"
    record: Any = None  # the transport's TransferRecord, once a transport delivered it

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def to_torch(self) -> dict[str, Any]:
        """The tensors as torch tensors (sharing memory where torch allows), same nesting."""
        return map_leaves(self.tensors, to_torch)


def message_tensors(table: TensorTable, arrays: list[np.ndarray]) -> dict[str, Any]:
    """The message's (nested) dict of tensors, given its arrays in body order."""
    if table.flat_names is not None:
        return dict(zip(table.flat_names, arrays, strict=True))
    return unflatten([(s.path, a) for s, a in zip(table.specs, arrays, strict=True)])
