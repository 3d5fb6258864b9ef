"""The testbed where namespaces cannot be made: every node on 127.0.0.1, nothing shaped.

Same interface as :class:`~tensorwire.testbed.Testbed`; its ``label`` is ``"unshaped
loopback"`` and ``shaped`` is False, and both travel with every :class:`Counters` reading, so
no result from it can pass for a shaped run. Asking it for a shaped profile is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tensorwire.testbed.base import BaseTestbed
from tensorwire.testbed.counters import Counters, LinkCounters, parse_snmp_tcp
from tensorwire.testbed.errors import ShapingUnavailable
from tensorwire.testbed.profile import PROFILES, LinkProfile, as_profile
from tensorwire.testbed.shaping import AppliedShaping

LABEL = "unshaped loopback"


class LoopbackTestbed(BaseTestbed):
    """``devices`` device nodes and a server node, all plain processes on 127.0.0.1 in this
    machine's own network namespace; counters are the whole host's (TCP) and ``lo``'s."""

    shaped = False

    def __init__(self, devices: int = 2, profile: LinkProfile | str | None = "none") -> None:
        super().__init__(devices)
        self.set_profile(profile or "none")

    @property
    def label(self) -> str:
        return LABEL

    def open(self) -> LoopbackTestbed:
        super().open()
        return self

    def address(self, node: str) -> str:
        self.node(node)
        return "127.0.0.1"

    @property
    def device_namespaces(self) -> list[str]:
        """No namespaces: an empty list."""
        return []

    def _enter(self, node: str) -> tuple[str, ...]:
        return ()

    def _proc_net(self, node: str, name: str) -> str:
        return Path(f"/proc/net/{name}").read_text()

    @property
    def shaping(self) -> AppliedShaping:
        return self._shaping

    def set_profile(
        self,
        profile: LinkProfile | str | None,
        direction: str | None = None,
        *,
        links: Sequence[LinkProfile | str] | None = None,
    ) -> None:
        """Only unshaped profiles: a loopback link cannot be shaped."""
        for chosen in [as_profile(profile), *(as_profile(link) for link in links or ())]:
            if chosen.shaped:
                raise ShapingUnavailable(
                    f"{LABEL}: cannot apply {chosen.describe()!r}; shaping needs network "
                    "namespaces (Testbed), see Testbed.capabilities()"
                )
        self._shaping = AppliedShaping(
            profile=PROFILES["none"],
            direction=direction or "both",
            rate_by=None,
            loss_by=None,
            delay_applied=False,
            notes=(f"{LABEL}: no namespaces, no shaping",),
        )

    def counters(self) -> Counters:
        tcp = parse_snmp_tcp(self._proc_net("", "snmp"))
        stats = Path("/sys/class/net/lo/statistics")

        def read(key: str) -> int:
            return int((stats / key).read_text())

        lo = LinkCounters(
            node="host",
            ifname="lo",
            rx_bytes=read("rx_bytes"),
            tx_bytes=read("tx_bytes"),
            rx_packets=read("rx_packets"),
            tx_packets=read("tx_packets"),
            role="host",
        )
        return Counters(
            tcp_retrans_segs={"host": tcp["RetransSegs"]},
            tcp_out_segs={"host": tcp["OutSegs"]},
            links={"lo": lo},
            label=LABEL,
            shaped=False,
        )
