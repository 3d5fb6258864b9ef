"""The links of a testbed: a bridge in the server namespace, a veth per device, shaping, stats.

Topology (for devices 1..N, prefix P, subnet 10.211.0.0/24 by default)::

    P-srv:  bridge Pbr 10.211.0.1/24 -- Ps1 ... PsN (server ends of the veths, bridge ports)
    P-devI: PdI 10.211.0.(I+1)/24    (device end of veth I)

so every device reaches the server at the one address 10.211.0.1. Links, addresses and qdiscs
are set with pyroute2 over netlink; nftables rules with the ``nft`` program run inside the
namespace, because pyroute2's nftables API cannot express ``numgen random``.
"""

from __future__ import annotations

import errno
import ipaddress
import subprocess
from typing import Any

from pyroute2 import IPRoute, NetlinkError

from tensorwire.testbed._netns import Netns, read_proc_net, write_sysctls
from tensorwire.testbed.counters import parse_snmp_tcp
from tensorwire.testbed.errors import TestbedError
from tensorwire.testbed.profile import LinkProfile
from tensorwire.testbed.shaping import (
    AppliedShaping,
    netem_parameters,
    nft_loss_script,
    plan_shaping,
    tbf_parameters,
)

SERVER = "srv"
# No IPv6: its router solicitations and DAD would add packets to the veth counters.
_SYSCTLS = {
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
}


def device_node(i: int) -> str:
    """The node name of device ``i`` (1-based): ``dev1``, ``dev2``, ..."""
    return f"dev{i}"


class Fabric:
    """Builds and shapes the links between namespaces that already exist (root in their user
    namespace is needed). ``namespaces`` maps ``srv``, ``dev1`` ... to :class:`Netns`."""

    def __init__(
        self,
        namespaces: dict[str, Netns],
        prefix: str,
        subnet: str,
        netem: bool,
        nft: str | None,
    ) -> None:
        self.namespaces = namespaces
        self.prefix = prefix
        self.subnet = ipaddress.IPv4Network(subnet)
        self.devices = len(namespaces) - 1
        self.netem = netem
        self.nft = nft  # path of the nft program, if nftables' netdev hook works here
        self._ipr: dict[str, IPRoute] = {}
        self._nft_tables: set[str] = set()  # nodes that hold our loss table

    # --- names and addresses --------------------------------------------------------------

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def server_end(self, i: int) -> str:
        """The server-side veth of device ``i`` (a port of the bridge)."""
        return f"{self.prefix}s{i}"

    def device_end(self, i: int) -> str:
        """The device-side veth of device ``i``."""
        return f"{self.prefix}d{i}"

    def address(self, node: str) -> str:
        """The IPv4 address of ``node``: the subnet's first host for the server, then devices."""
        index = 1 if node == SERVER else int(node.removeprefix("dev")) + 1
        return str(self.subnet[index])

    # --- building -------------------------------------------------------------------------

    def build(self) -> None:
        """Create the bridge, the veths and the addresses, all links up.

        Every link sends one packet per buffer (``gso_max_segs 1``): otherwise TCP hands veth
        64 kB segmentation-offload buffers, and a loss rule would drop 40 packets at once."""
        if self.devices + 2 > self.subnet.num_addresses - 1:
            raise TestbedError(f"subnet {self.subnet} has no room for {self.devices} devices")
        for node, ns in self.namespaces.items():
            write_sysctls(ns.path, _SYSCTLS)
            self._ipr[node] = IPRoute(netns=ns.path)
        srv = self._ipr[SERVER]
        srv.link("add", ifname=self.bridge, kind="bridge")
        bridge = self._index(SERVER, self.bridge)
        srv.addr("add", index=bridge, address=self.address(SERVER), prefixlen=self.subnet.prefixlen)
        for i in range(1, self.devices + 1):
            node = device_node(i)
            srv.link(
                "add",
                ifname=self.server_end(i),
                kind="veth",
                peer={"ifname": self.device_end(i), "net_ns_fd": self.namespaces[node].path},
            )
            srv.link(
                "set",
                index=self._index(SERVER, self.server_end(i)),
                master=bridge,
                state="up",
                gso_max_segs=1,
            )
            dev = self._ipr[node]
            end = self._index(node, self.device_end(i))
            dev.addr("add", index=end, address=self.address(node), prefixlen=self.subnet.prefixlen)
            dev.link("set", index=end, state="up", gso_max_segs=1)
            dev.link("set", index=self._index(node, "lo"), state="up")
        srv.link("set", index=bridge, state="up", gso_max_segs=1)
        srv.link("set", index=self._index(SERVER, "lo"), state="up")

    def _index(self, node: str, ifname: str) -> int:
        found = self._ipr[node].link_lookup(ifname=ifname)
        if not found:
            raise TestbedError(f"interface {ifname} not found in {self.namespaces[node].name}")
        return found[0]

    # --- shaping --------------------------------------------------------------------------

    def shape(self, profile: LinkProfile, direction: str) -> AppliedShaping:
        """Apply ``profile`` to every device link (replacing what was there) in ``direction``
        (both, up = device to server, down = server to device)."""
        plan = plan_shaping(profile, direction, self.netem, self.nft is not None)
        up = direction in ("both", "up")
        down = direction in ("both", "down")
        for i in range(1, self.devices + 1):
            node = device_node(i)
            self._set_qdisc(node, self.device_end(i), profile, plan, apply=up)
            self._set_qdisc(SERVER, self.server_end(i), profile, plan, apply=down)
        nft_loss = plan.loss_by == "nftables"
        # Loss is made where packets arrive: uplink at the server ends, downlink at devices.
        self._set_loss(
            SERVER,
            [self.server_end(i) for i in range(1, self.devices + 1)] if up and nft_loss else [],
            profile.loss,
        )
        for i in range(1, self.devices + 1):
            self._set_loss(
                device_node(i), [self.device_end(i)] if down and nft_loss else [], profile.loss
            )
        return plan

    def _set_qdisc(
        self, node: str, ifname: str, profile: LinkProfile, plan: AppliedShaping, apply: bool
    ) -> None:
        ipr = self._ipr[node]
        index = self._index(node, ifname)
        try:
            ipr.tc("del", index=index, root=True)
        except NetlinkError as exc:
            if exc.code not in (errno.ENOENT, errno.EINVAL):  # nothing of ours there yet
                raise
        if not apply:
            return
        tbf = tbf_parameters(profile.rate) if profile.rate is not None else None
        if plan.delay_applied or plan.loss_by == "netem":
            netem = netem_parameters(profile, loss=plan.loss_by == "netem")
            ipr.tc("add", "netem", index=index, handle="1:", **netem)
            if tbf is not None:
                ipr.tc(
                    "add",
                    "tbf",
                    index=index,
                    handle="10:",
                    parent="1:1",
                    rate=tbf.rate,
                    burst=tbf.burst,
                    limit=tbf.limit,
                )
        elif tbf is not None:
            ipr.tc(
                "add",
                "tbf",
                index=index,
                handle="1:",
                rate=tbf.rate,
                burst=tbf.burst,
                limit=tbf.limit,
            )

    def _set_loss(self, node: str, ifnames: list[str], loss: float) -> None:
        if not ifnames and node not in self._nft_tables:
            return
        assert self.nft is not None
        script = nft_loss_script(f"{self.prefix}loss", ifnames, loss)
        ns = self.namespaces[node]
        done = subprocess.run(
            [*ns.enter, self.nft, "-f", "-"],
            input=script,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise TestbedError(f"nft failed in {ns.name}: {done.stderr.strip()}\nscript:\n{script}")
        if ifnames:
            self._nft_tables.add(node)
        else:
            self._nft_tables.discard(node)

    # --- measuring ------------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        """Raw counters: ``tcp`` maps node to its ``/proc/net/snmp`` Tcp fields; ``links``
        lists per veth end (and the bridge) node, ifname and rx/tx bytes and packets."""
        tcp = {
            node: parse_snmp_tcp(read_proc_net(ns.path, "snmp"))
            for node, ns in self.namespaces.items()
        }
        ours = (
            {self.bridge}
            | {self.server_end(i) for i in range(1, self.devices + 1)}
            | {self.device_end(i) for i in range(1, self.devices + 1)}
        )
        links = []
        for node, ipr in self._ipr.items():
            for link in ipr.get_links():
                ifname = link.get_attr("IFLA_IFNAME")
                if ifname not in ours:
                    continue
                stats = link.get_attr("IFLA_STATS64")
                links.append(
                    {
                        "node": node,
                        "ifname": ifname,
                        **{
                            key: stats[key]
                            for key in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")
                        },
                    }
                )
        return {"tcp": tcp, "links": links}

    def proc_net(self, node: str, name: str) -> str:
        """``/proc/net/<name>`` as ``node``'s namespace sees it."""
        return read_proc_net(self.namespaces[node].path, name)

    def close(self) -> None:
        """Close the netlink sockets (the namespaces' owner removes the links)."""
        for ipr in self._ipr.values():
            ipr.close()
        self._ipr.clear()
