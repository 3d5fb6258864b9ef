"""A group's settings, as one typed value (seconds and bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tensorwire.collective.compression import Compression, CompressionMethod, compression_of

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
      the CPU of a 64 MiB allreduce over 4 ranks there).
    - ``compress``: how ``allreduce`` compresses tensors when not told on the call:
      ``"fp16"``, ``"bf16"``, ``"int8"``, ``"topk"``, ``"randomk"``, a
      :class:`~tensorwire.collective.Compression`, or None (exact).
    """

    timeout: float = 60.0
    connect_timeout: float = 60.0
    heartbeat: float = 0.5
    ring_min_bytes: int = 512 * KiB
    piece_bytes: int = 4096 * KiB
    checksum: bool | Literal["auto"] = "auto"
    compress: CompressionMethod | Compression | None = None

    def __post_init__(self) -> None:
        compression_of(self.compress)  # a wrong name fails as the group forms, not mid-run
        if self.checksum not in (True, False, "auto"):
            raise ValueError(f"checksum={self.checksum!r}: choose True, False or 'auto'")

    @property
    def silence(self) -> float:
        """Seconds without a byte from a rank after which it counts as hung."""
        return 4 * self.heartbeat
