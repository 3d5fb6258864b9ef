"""mem:// under the conformance suite.

Hub and channels share this process, so its peers that hang or die are threads
(``IN_PROCESS``), and the medium a stranger reaches is the hub's own entry point (what a
channel's send hands it). Nothing crosses a network: there is no ``proxied_url``; security
takes the default hooks (TLS settings accepted and unused, device keys checked).
"""

from __future__ import annotations

import uuid

SCHEME = "mem"
IN_PROCESS = True


def hub_url(request) -> str:
    """A name no other test uses."""
    return f"mem://tw-test-{uuid.uuid4().hex[:12]}"


def later_hub_url(request) -> str:
    """A name a channel can dial before a hub serves it."""
    return hub_url(request)


def _hub(hub_url: str):
    from tensorwire.transports import mem

    return mem._hubs[hub_url.removeprefix("mem://")]


def _joined(hub_url: str, client_id: str):
    """A connection that said a valid hello and got its welcome."""
    from tensorwire.transports.session import ClientSession

    hub = _hub(hub_url)
    conn = hub._accept()
    hub._take(
        conn, ClientSession(client_id, decoders=[], max_message_bytes=1 << 20).hello().to_bytes()
    )
    conn.to_channel.get(10)  # the welcome
    return hub, conn


def inject_garbage(hub_url: str) -> None:
    """Join as client "intruder", then hand the hub bytes that are no message."""
    hub, conn = _joined(hub_url, "intruder")
    hub._take(conn, b"\xde\xad\xbe\xef" * 64)
    conn.hang_up("the intruder left")


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As strangers at the hub's entry: junk instead of a hello, a prefix declaring an 8 MiB
    header, a header declaring a 1 GiB tensor cut short; then, joined, the same junk; and a
    hundred connections that say nothing."""
    import numpy as np

    from tensorwire.wire import encode_message
    from tensorwire.wire.format import MAGIC, PREFIX, VERSION

    hub = _hub(hub_url)
    junk = b"\xde\xad\xbe\xef" * 64
    huge_header = PREFIX.pack(MAGIC, VERSION, 0, 0, (8 << 20) - 1, 0, 1 << 40)
    big = encode_message({"x": np.zeros(1 << 28, np.float32)}, {}).head  # 1 GiB declared
    for first in (junk, huge_header, bytes(big)):
        hub._take(hub._accept(), first)
    _, conn = _joined(hub_url, f"stranger-{uuid.uuid4().hex[:8]}")
    for packet in (junk, huge_header, bytes(big)):
        hub._take(conn, packet)
    conn.hang_up("the stranger left")
    idle = [hub._accept() for _ in range(100)]
    for c in idle:
        c.hang_up("never said a word")
