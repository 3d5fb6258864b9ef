"""A zmq hub's state for one client's session, and how a peer is named in logs."""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from tensorwire.transports.session import HubSession
from tensorwire.transports.zmq.reassembler import Reassembler


def peer_name(ident: bytes) -> str:
    try:
        return ident.decode("utf-8") if ident[:1] != b"\0" else f"0x{ident.hex()}"
    except UnicodeDecodeError:
        return f"0x{ident.hex()}"


@dataclass(eq=False)
class Peer:
    """A client whose hello the hub welcomed, on the connection it came on."""

    client_id: str
    ident: bytes  # its routing id: the session id of its hello
    fd: int  # the hub's file descriptor of its connection
    session: HubSession
    reader: Reassembler


def stranger_name(ident: bytes, frames: list[zmq.Frame]) -> str:
    """A peer without a session, for logs: its address and routing id."""
    try:
        address = frames[0].get("Peer-Address")
    except zmq.ZMQError:
        address = "?"
    return f"{address} (routing id {peer_name(ident)})"
