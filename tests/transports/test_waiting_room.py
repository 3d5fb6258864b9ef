"""WaitingRoom.would_push says which arrival time a newcomer would push out (its source's
oldest at that source's bound, else the oldest of all at the total), and None with room."""

from __future__ import annotations

from tensorwire.transports.sockets.waiting_room import WaitingRoom


def test_would_push_names_the_entry_add_would_push_out():
    room: WaitingRoom[str] = WaitingRoom(total=3, per_source=2)
    room.add("a1", "A", 1.0)
    assert room.would_push("A") is None
    room.add("a2", "A", 2.0)
    assert room.would_push("A") == 1.0  # A is at its bound: its oldest goes
    assert room.would_push("B") is None
    room.add("b1", "B", 3.0)
    assert room.would_push("B") == 1.0  # the room is full: the oldest of all goes
    assert room.add("b2", "B", 4.0) == [("a1", "3 newer ones came")]
    assert room.would_push("A") == 2.0  # full again: a2 is now the oldest of all
