"""What a ``tcp://`` hub takes beside every hub's options."""

from __future__ import annotations

from dataclasses import dataclass

from tensorwire.transports.base import HubOptions


@dataclass(frozen=True, kw_only=True)
class TcpHubOptions(HubOptions):
    """A tcp hub's options: :class:`HubOptions` and its listening socket's backlog."""

    backlog: int = 128
    """Connections the kernel queues until the hub's accept thread takes them."""
