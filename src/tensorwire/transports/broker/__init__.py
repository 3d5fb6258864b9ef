"""The base of the broker transports (``mqtt``, ``amqp``): what they share, written once.

A broker is a shared medium between hub and channels: payloads are sealed end to end
(``payloads``), chunked messages are reassembled timed and bounded (``inflow``), a peer that
goes quiet has a grace of the medium's connected time to show itself (``graces``), and the
broker connection dropping and returning (medium lost / back) is ridden out by
:class:`BrokerHub` (``hub``) and :class:`BrokerChannel` (``channel``), which the transports
subclass as publish/subscribe adapters.
"""

from tensorwire.transports.broker.channel import EARLY_BYTES, BrokerChannel
from tensorwire.transports.broker.graces import Graces
from tensorwire.transports.broker.hub import BrokerHub, BrokerPeer
from tensorwire.transports.broker.inflow import Inflow
from tensorwire.transports.broker.payloads import (
    HUB_SENDER,
    lone_chunk,
    one_chunk,
    sealed,
    unsealed,
)

__all__ = [
    "EARLY_BYTES",
    "HUB_SENDER",
    "BrokerChannel",
    "BrokerHub",
    "BrokerPeer",
    "Graces",
    "Inflow",
    "lone_chunk",
    "one_chunk",
    "sealed",
    "unsealed",
]
