"""Transfer records of a run as rows: one per message per side (server or device)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tensorwire.transports import TransferRecord


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
