"""How many connections a broker lets in, where a URL says so (``connection_max=``).

A private broker tensorwire starts knows its limit and puts it in the URLs it hands out; a hub
on it warns before its devices fill it (:meth:`BrokerHub._mind_room`), and a device the
broker turns away at the limit gets :class:`~tensorwire.errors.BrokerFull` naming it.
"""

from __future__ import annotations

from tensorwire.errors import TransportError


def parse_connection_max(shown: str, text: str | None) -> int | None:
    """``connection_max=``: the most connections the broker takes (its own setting), if known;
    ``shown`` is the URL as messages show it."""
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise TransportError(f"{shown!r}: connection_max={text!r} is not a number of connections")
    return int(text)
