"""Liveness on a broker, sans-IO: who is suspected of being gone, and until when it may still
show itself (a member whose will came or whose queue lost its consumer; a hub that went quiet).

A broker restart looks like every peer dying at once (Mosquitto publishes every will as it
shuts down), so graces count the medium's connected time only: :meth:`Graces.restart` gives
every suspect a whole grace again when the medium is back. Times are ``time.monotonic()``.
"""

from __future__ import annotations


class Graces:
    """The suspects, each with the moment its ``grace`` (seconds) runs out and why it would be
    gone then."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._until: dict[str, tuple[float, str]] = {}

    def suspect(self, who: str, why: str, now: float, *, again: bool = True) -> None:
        """``who`` must show itself within a grace from ``now``; ``again=False`` keeps the
        clock of one already suspected running."""
        if again or who not in self._until:
            self._until[who] = (now + self.grace, why)

    def clear(self, who: str) -> None:
        """``who`` showed itself."""
        self._until.pop(who, None)

    def __contains__(self, who: object) -> bool:
        return who in self._until

    def restart(self, now: float) -> None:
        """The medium is back: every suspect gets a whole grace from ``now``."""
        self._until = {who: (now + self.grace, why) for who, (_, why) in self._until.items()}

    def due(self, now: float) -> list[tuple[str, str]]:
        """``(who, why)`` of each suspect whose grace ran out (no longer suspects)."""
        gone = [(who, why) for who, (until, why) in self._until.items() if until <= now]
        for who, _ in gone:
            del self._until[who]
        return gone
