"""What a ``zmq+tcp://`` hub and channel take beside every hub's and channel's options."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tensorwire.transports.base import ChannelOptions, HubOptions


@dataclass(frozen=True, kw_only=True)
class ZmqHubOptions(HubOptions):
    """A zmq hub's options: :class:`HubOptions` and its CURVE key pair."""

    curve: str | os.PathLike[str] | None = None
    """The file of the hub's CURVE key pair (its public key, then its secret key, one per
    line; ``tensorwire certs`` writes ``hub.curve``); None: ``hub.curve`` beside ``tls.cert``
    when ``tls`` is given, else no encryption. The URL option ``?curve=`` says the same."""


@dataclass(frozen=True, kw_only=True)
class ZmqChannelOptions(ChannelOptions):
    """A zmq channel's options: :class:`ChannelOptions` and the hub's CURVE public key."""

    curve: str | os.PathLike[str] | None = None
    """A file whose first line is the hub's CURVE public key (``hub.curve.pub``); None:
    ``hub.curve.pub`` beside ``tls.ca`` when ``tls`` is given, else no encryption. The URL
    option ``?curve=`` says the same."""
