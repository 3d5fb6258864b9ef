"""The Flight server a :class:`~tensorwire.transports.flight.FlightHub` runs: it hands each
``DoExchange`` call to the hub as a session's downlink or uplink, and refuses any other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow.flight as flight

from tensorwire.errors import TransportError
from tensorwire.transports.flight.options import UP

if TYPE_CHECKING:
    from tensorwire.transports.flight.hub import FlightHub


def caller(context: flight.ServerCallContext) -> str:
    """The caller's address without its port ("ipv4:127.0.0.1"): one key per host, so that
    a flood of calls from one host is logged as one."""
    return context.peer().rpartition(":")[0] or context.peer()


class FlightServer(flight.FlightServerBase):
    def __init__(self, hub: FlightHub, location: flight.Location, **tls: Any) -> None:
        super().__init__(location, **tls)
        self._hub = hub

    def do_exchange(self, context, descriptor, reader, writer) -> None:
        if descriptor.descriptor_type == flight.DescriptorType.CMD:
            self._hub._serve_downlink(context, descriptor.command, writer)
            return
        path = tuple(descriptor.path or ())
        if len(path) == 3 and path[:2] == UP:
            self._hub._serve_uplink(context, path[2].decode("ascii", "replace"), reader)
            return
        self._hub._refused(caller(context), TransportError(f"unknown descriptor {descriptor!r}"))
        raise flight.FlightServerError(
            f"unknown descriptor {descriptor!r}: this is a tensorwire hub; "
            "use tensorwire.connect('flight://...')"
        )
