"""Membership across reconnects: an old connection that ends late does not remove the client
that came back on a new one (the race behind a rare failure of a tcp reconnect test)."""

from __future__ import annotations

import tensorwire


def test_a_late_leave_of_the_old_connection_keeps_the_reconnected_client():
    left: list[tuple[str, str]] = []
    with tensorwire.serve("tcp://127.0.0.1:0", on_leave=lambda c, r: left.append((c, r))) as hub:
        old, new = object(), object()
        hub._joined("dev", frozenset(), session=old)
        hub._joined("dev", frozenset(), session=new)  # reconnected before the old one ended
        hub._left("dev", "old connection ended", session=old)
        assert hub.clients == ["dev"] and left == []
        hub._left("dev", "closed", session=new)
        assert hub.clients == [] and left == [("dev", "closed")]
        hub._joined("other", frozenset())  # transports without sessions leave by id alone
        hub._left("other", "said goodbye")
        assert hub.clients == []
