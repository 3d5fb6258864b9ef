"""Counters a testbed reads per round: TCP segments sent and retransmitted per namespace, and
bytes and packets per link end. Subtract two readings for what happened in between."""

from __future__ import annotations

import dataclasses
from typing import Any

from tensorwire.testbed.errors import TestbedError


@dataclasses.dataclass(frozen=True)
class LinkCounters:
    """One network interface of ``node``: bytes and packets received and sent. ``role`` says
    which end of which link it is: ``port`` (the server's or switch's end of a device's link),
    ``device`` (the device's end), ``shared-server`` / ``shared-switch`` (the ends of the
    access link every device shares, on a shared topology), ``bridge``; empty if unknown."""

    node: str
    ifname: str
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    role: str = ""


@dataclasses.dataclass(frozen=True)
class Counters:
    """A reading of a testbed's counters.

    ``tcp_retrans_segs`` / ``tcp_out_segs`` map a node (``srv``, ``dev1`` ...) to RetransSegs /
    OutSegs of ``/proc/net/snmp`` in its namespace; ``links`` maps an interface name to its
    :class:`LinkCounters`. ``label`` says what kind of testbed measured them (e.g.
    ``"unshaped loopback"``) and ``shaped`` whether its links were shaped."""

    tcp_retrans_segs: dict[str, int]
    tcp_out_segs: dict[str, int]
    links: dict[str, LinkCounters]
    label: str
    shaped: bool

    def __sub__(self, earlier: Counters) -> Counters:
        """The increase since ``earlier`` (a reading of the same testbed)."""
        return Counters(
            tcp_retrans_segs=_minus(self.tcp_retrans_segs, earlier.tcp_retrans_segs),
            tcp_out_segs=_minus(self.tcp_out_segs, earlier.tcp_out_segs),
            links={
                name: dataclasses.replace(
                    link,
                    **{
                        field: getattr(link, field) - getattr(earlier.links[name], field)
                        for field in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")
                    },
                )
                for name, link in self.links.items()
                if name in earlier.links
            },
            label=self.label,
            shaped=self.shaped,
        )

    @property
    def total_retrans_segs(self) -> int:
        """Retransmitted TCP segments summed over all nodes."""
        return sum(self.tcp_retrans_segs.values())

    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows, one per node and one per link, each with ``label`` and ``shaped``."""
        rows: list[dict[str, Any]] = [
            {
                "kind": "tcp",
                "node": node,
                "ifname": None,
                "tcp_out_segs": self.tcp_out_segs[node],
                "tcp_retrans_segs": retrans,
            }
            for node, retrans in self.tcp_retrans_segs.items()
        ]
        rows += [{"kind": "link", **dataclasses.asdict(link)} for link in self.links.values()]
        for row in rows:
            row.update(label=self.label, shaped=self.shaped)
        return rows

    @classmethod
    def from_raw(cls, raw: dict[str, Any], label: str, shaped: bool) -> Counters:
        """Counters from a backend's raw reading (``tcp`` snmp fields, ``links`` dicts)."""
        return cls(
            tcp_retrans_segs={node: tcp["RetransSegs"] for node, tcp in raw["tcp"].items()},
            tcp_out_segs={node: tcp["OutSegs"] for node, tcp in raw["tcp"].items()},
            links={link["ifname"]: LinkCounters(**link) for link in raw["links"]},
            label=label,
            shaped=shaped,
        )


def _minus(later: dict[str, int], earlier: dict[str, int]) -> dict[str, int]:
    return {key: value - earlier.get(key, 0) for key, value in later.items()}


def parse_snmp_tcp(text: str) -> dict[str, int]:
    """The ``Tcp:`` fields of ``/proc/net/snmp`` text, e.g. ``{"RetransSegs": 12, ...}``."""
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2:
        raise TestbedError("no Tcp lines in /proc/net/snmp")
    return {key: int(value) for key, value in zip(rows[0], rows[1], strict=True)}
