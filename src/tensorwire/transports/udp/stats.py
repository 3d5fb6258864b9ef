"""The counters of one udp:// endpoint (all its peers)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class UdpStats:
    """Counters of one endpoint (all its peers), since it opened."""

    datagrams_sent: int = 0
    retransmits: int = 0  # datagrams sent again because a NACK listed them
    nack_rounds: int = 0  # NACKs a reliable sender acted on
    partial_messages: int = 0  # best-effort messages delivered with lost ranges
    lost_messages: int = 0  # best-effort messages whose header or half their bytes were lost
    stranger_datagrams: int = 0  # datagrams from addresses of no joined peer, dropped
    refused_datagrams: int = 0  # sealed sessions: datagrams that did not verify or came before
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)
