"""What a run records: a row per round, per transfer, per device and round, per event."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tensorwire.fl.config import FLConfig
from tensorwire.transports import TransferRecord


@dataclass
class RunResult:
    """What a run produced, as rows (the run directory's tables):

    - ``rounds``: one per round (accuracy, losses, bytes, times, which devices were sampled,
      applied, late, missing, rejected or failed, and whether the round reached its quorum);
    - ``transfers``: one per model or update message per side (server and device);
    - ``updates``: one per device and round it took part in, with its status and the reason;
    - ``events``: the hub's membership events (joined, left, replaced, slow, refused ...).
    """

    config: FLConfig
    rounds: list[dict[str, Any]] = field(default_factory=list)
    transfers: list[dict[str, Any]] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def keep_until(self, round_: int) -> None:
        """Drop what belongs to rounds after ``round_`` (a resumed run does them again)."""
        self.rounds = [r for r in self.rounds if r["round"] <= round_]
        self.transfers = [t for t in self.transfers if t["round"] <= round_]
        self.updates = [u for u in self.updates if u["round"] <= round_]
        self.events = [e for e in self.events if e["round"] <= round_]


def transfer_rows(
    round_: int, side: str, records: Iterable[TransferRecord], device: str | None = None
) -> list[dict[str, Any]]:
    """Rows for ``records`` seen by ``side`` ("server" or "device"); ``device`` names the
    device for a device's own records (the server's name their peer)."""
    rows = []
    for rec in records:
        downlink = (rec.direction == "send") == (side == "server")
        row = rec.as_dict()
        row["role"] = row.pop("direction")  # "send" or "recv": this side's part in the transfer
        row.update(
            round=round_,
            side=side,
            device=device or rec.peer,
            direction="downlink" if downlink else "uplink",
        )
        rows.append(row)
    return rows
