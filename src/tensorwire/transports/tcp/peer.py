"""A tcp hub's state for one connected client, and who may read its connection."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field

from tensorwire.transports.session import HubSession
from tensorwire.transports.sockets import StreamReader


@dataclass(eq=False)
class Peer:
    """A client whose hello the hub welcomed, on its connection."""

    client_id: str
    sock: socket.socket
    send_lock: threading.Lock
    reader: StreamReader | None = None
    session: HubSession | None = None
    # Reading (see the hub's module doc): whoever holds ``turn`` may use reader and session.
    turn: threading.Lock = field(default_factory=threading.Lock)
    callers: int = 0  # recv calls reading this connection, or waiting to (under hub._turns)
    callers_left_at: float = 0.0  # time.monotonic() when the last one stopped
    polling: bool = False  # its reader thread waits (or is about to) in poll
    ended: str | None = None  # why its connection is over, once it is
    turns: bool = False  # recv may read it: its reader thread takes turns (after on_join)
    wake_r: socket.socket | None = None  # wakes its reader thread out of poll
    wake_w: socket.socket | None = None
