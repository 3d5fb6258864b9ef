"""A group's settings, as one typed value (seconds and bytes)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from tensorwire.collective.compression import Compression, CompressionMethod, compression_of
from tensorwire.collective.credentials import GroupCredentials

KiB = 1 << 10


@dataclass(frozen=True)
class GroupOptions:
    """How a :class:`~tensorwire.collective.Group` forms and runs its operations.

    - ``timeout``: seconds an operation may take when it is not given its own ``timeout=``;
      past it every rank raises :class:`~tensorwire.errors.RankFailed` naming the culprit.
    - ``connect_timeout``: seconds to rendezvous and connect to every other rank.
    - ``heartbeat``: seconds an idle link waits before it says "still here"; a rank silent
      for ``4 * heartbeat`` when an operation runs out of time is the one named as hung.
    - ``ring_min_bytes``: tensors of at least this many bytes are allreduced and broadcast
      along the ring (bandwidth-optimal); smaller ones by recursive doubling or a binomial
      tree (fewer steps, so lower latency). ``algorithm=`` on a call overrides it. The
      default sits where the two crossed on loopback with 4 ranks (between 256 KiB and
      1 MiB); on links with a longer round trip the crossover is higher.
    - ``piece_bytes``: the ring and the chain move tensors in pieces of at most this many
      bytes, so that a piece travels on while the next is received (every link busy).
    - ``checksum``: every piece carries an xxh3 digest of its bytes, checked on arrival:
      True, False, or ``"auto"`` (the default): on every link but those over loopback,
      where the bytes never leave this host's memory (the digests cost about a sixth of
      the CPU of a 64 MiB allreduce over 4 ranks there), and sealed ones (``credentials``:
      every record's AEAD tag already proves its bytes).
    - ``compress``: how ``allreduce`` compresses tensors when not told on the call:
      ``"fp16"``, ``"bf16"``, ``"int8"``, ``"topk"``, ``"randomk"``, a
      :class:`~tensorwire.collective.Compression`, or None (exact).
    - ``elastic``: a rank that fails, hangs or leaves is dropped and the operation is done
      again over the ranks left; a restarted rank rejoins (see :mod:`.elastic`). It needs a
      coordinator that outlives ranks: ``Rendezvous(url, size, elastic=True)`` (or rank 0's
      hub, kept up for the group's life), and costs one round trip to it per operation.
    - ``credentials``: a :class:`~tensorwire.collective.GroupCredentials`, or a directory
      ``tensorwire certs`` wrote (each rank reads its own ``rank-N`` files there): the
      rendezvous admits enrolled ranks only and every link is TLS 1.3 with sealed records,
      each rank proving which rank it is. None: plain links, the group's token only.
    """

    timeout: float = 60.0
    connect_timeout: float = 60.0
    heartbeat: float = 0.5
    ring_min_bytes: int = 512 * KiB
    piece_bytes: int = 4096 * KiB
    checksum: bool | Literal["auto"] = "auto"
    compress: CompressionMethod | Compression | None = None
    elastic: bool = False
    credentials: GroupCredentials | str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        compression_of(self.compress)  # a wrong name fails as the group forms, not mid-run
        if self.checksum not in (True, False, "auto"):
            raise ValueError(f"checksum={self.checksum!r}: choose True, False or 'auto'")

    @property
    def silence(self) -> float:
        """Seconds without a byte from a rank after which it counts as hung."""
        return 4 * self.heartbeat
