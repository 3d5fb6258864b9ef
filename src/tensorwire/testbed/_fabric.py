"""The links of a testbed: bridges, veths, shaping and stats, in one of three topologies.

``star`` (for devices 1..N, prefix P, subnet 10.211.0.0/24 by default)::

    P-srv:  bridge Pbr 10.211.0.1/24 -- Ps1 ... PsN (server ends of the veths, bridge ports)
    P-devI: PdI 10.211.0.(I+1)/24    (device end of veth I)

``shared`` and ``shared-broker-near`` put a switch namespace between them, so that the server
reaches every device through one access link (shaped with the profile) and each device hangs
off the switch on its own link (unshaped, or its own profile)::

    P-srv:  Pup 10.211.0.1/24 ===shared link=== Pul (a port of the switch's bridge)
    P-sw:   bridge Pbr 10.211.0.254/24 -- Pul, Ps1 ... PsN
    P-devI: PdI 10.211.0.(I+1)/24

so every device reaches the server at the one address 10.211.0.1, and the switch (where a
broker near the devices runs) at the subnet's last host. Links, addresses and qdiscs are set
with pyroute2 over netlink; nftables rules with the ``nft`` program run inside the namespace,
because pyroute2's nftables API cannot express ``numgen random``.
"""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import subprocess
from typing import Any

from pyroute2 import IPRoute, NetlinkError

from tensorwire.testbed._netns import Netns, read_proc_net, write_sysctls
from tensorwire.testbed.counters import parse_snmp_tcp
from tensorwire.testbed.errors import TestbedError
from tensorwire.testbed.profile import PROFILES, LinkProfile
from tensorwire.testbed.shaping import (
    TOPOLOGIES,
    AppliedShaping,
    netem_parameters,
    nft_loss_script,
    plan_shaping,
    tbf_parameters,
)

SERVER = "srv"
SWITCH = "sw"
# No IPv6: its router solicitations and DAD would add packets to the veth counters.
_SYSCTLS = {
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
}


def device_node(i: int) -> str:
    """The node name of device ``i`` (1-based): ``dev1``, ``dev2``, ..."""
    return f"dev{i}"


def device_interface(prefix: str, i: int) -> str:
    """The device-side veth of device ``i`` of the testbed with ``prefix``: ``PREFIXdI``."""
    return f"{prefix}d{i}"


@dataclasses.dataclass(frozen=True)
class Link:
    """One shaped link: ``near`` is its end towards the server (node, ifname: downlink egress,
    uplink ingress), ``far`` its end towards the device(s) (uplink egress, downlink ingress).
    ``device`` is the device's number, or 0 for the shared access link."""

    device: int
    near: tuple[str, str]
    far: tuple[str, str]


# A link end's role in the counters, so that results tell the kinds of byte apart.
PORT, DEVICE, SHARED_SERVER, SHARED_SWITCH, BRIDGE = (
    "port",  # the server's or switch's end of a device's link
    "device",  # the device's end of its link
    "shared-server",  # the server's end of the shared access link
    "shared-switch",  # the switch's end of the shared access link
    "bridge",
)


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
        topology: str = "star",
    ) -> None:
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, not {topology!r}")
        self.namespaces = namespaces
        self.prefix = prefix
        self.subnet = ipaddress.IPv4Network(subnet)
        self.topology = topology
        self.shared = topology != "star"
        if self.shared and SWITCH not in namespaces:
            raise TestbedError(f"topology {topology} needs a {SWITCH} namespace")
        self.devices = sum(1 for node in namespaces if node.startswith("dev"))
        self.netem = netem
        self.nft = nft  # path of the nft program, if nftables' netdev hook works here
        self._ipr: dict[str, IPRoute] = {}
        self._nft_tables: set[str] = set()  # nodes that hold our loss table

    # --- names and addresses --------------------------------------------------------------

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def hub_node(self) -> str:
        """The node whose bridge joins the device links: the server, or the switch."""
        return SWITCH if self.shared else SERVER

    def server_end(self, i: int) -> str:
        """The server-side (or switch-side) veth of device ``i`` (a port of the bridge)."""
        return f"{self.prefix}s{i}"

    def device_end(self, i: int) -> str:
        """The device-side veth of device ``i``."""
        return device_interface(self.prefix, i)

    @property
    def uplink_server_end(self) -> str:
        """The server's end of the shared access link (shared topologies)."""
        return f"{self.prefix}up"

    @property
    def uplink_switch_end(self) -> str:
        """The switch's end of the shared access link (a port of its bridge)."""
        return f"{self.prefix}ul"

    def links(self) -> list[Link]:
        """The shaped links: the shared one first (device 0) where there is one."""
        hub = self.hub_node
        found = [
            Link(i, (hub, self.server_end(i)), (device_node(i), self.device_end(i)))
            for i in range(1, self.devices + 1)
        ]
        if self.shared:
            shared = Link(0, (SERVER, self.uplink_server_end), (SWITCH, self.uplink_switch_end))
            found.insert(0, shared)
        return found

    def address(self, node: str) -> str:
        """The IPv4 address of ``node``: the subnet's first host for the server, then devices,
        its last host for the switch."""
        if node == SWITCH:
            return str(self.subnet[-2])
        index = 1 if node == SERVER else int(node.removeprefix("dev")) + 1
        return str(self.subnet[index])

    # --- building -------------------------------------------------------------------------

    def build(self) -> None:
        """Create the bridge, the veths and the addresses, all links up.

        Every link sends one packet per buffer (``gso_max_segs 1``): otherwise TCP hands veth
        64 kB segmentation-offload buffers, and a loss rule would drop 40 packets at once."""
        if self.devices + 3 > self.subnet.num_addresses - 1:
            raise TestbedError(f"subnet {self.subnet} has no room for {self.devices} devices")
        for node, ns in self.namespaces.items():
            write_sysctls(ns.path, _SYSCTLS)
            self._ipr[node] = IPRoute(netns=ns.path)
        hub = self.hub_node
        ipr = self._ipr[hub]
        ipr.link("add", ifname=self.bridge, kind="bridge")
        bridge = self._index(hub, self.bridge)
        ipr.addr("add", index=bridge, address=self.address(hub), prefixlen=self.subnet.prefixlen)
        if self.shared:
            self._veth(
                SWITCH, self.uplink_switch_end, SERVER, self.uplink_server_end, master=bridge
            )
            self._address(SERVER, self.uplink_server_end)
        for i in range(1, self.devices + 1):
            self._veth(hub, self.server_end(i), device_node(i), self.device_end(i), master=bridge)
            self._address(device_node(i), self.device_end(i))
        ipr.link("set", index=bridge, state="up", gso_max_segs=1)
        for node in self.namespaces:
            self._ipr[node].link("set", index=self._index(node, "lo"), state="up")

    def _veth(self, node: str, ifname: str, peer_node: str, peer: str, master: int) -> None:
        """A veth ``ifname`` in ``node`` (a port of bridge ``master`` there) to ``peer`` in
        ``peer_node``; both ends up."""
        ipr = self._ipr[node]
        ipr.link(
            "add",
            ifname=ifname,
            kind="veth",
            peer={"ifname": peer, "net_ns_fd": self.namespaces[peer_node].path},
        )
        ipr.link("set", index=self._index(node, ifname), master=master, state="up", gso_max_segs=1)
        end = self._index(peer_node, peer)
        self._ipr[peer_node].link("set", index=end, state="up", gso_max_segs=1)

    def set_link_state(self, device: int, up: bool) -> None:
        """Device ``device``'s end of its link down or up (its address stays; the route to
        the subnet comes back with the link)."""
        node, ifname = device_node(device), self.device_end(device)
        self._ipr[node].link("set", index=self._index(node, ifname), state="up" if up else "down")

    def _address(self, node: str, ifname: str) -> None:
        self._ipr[node].addr(
            "add",
            index=self._index(node, ifname),
            address=self.address(node),
            prefixlen=self.subnet.prefixlen,
        )

    def _index(self, node: str, ifname: str) -> int:
        found = self._ipr[node].link_lookup(ifname=ifname)
        if not found:
            raise TestbedError(f"interface {ifname} not found in {self.namespaces[node].name}")
        return found[0]

    # --- shaping --------------------------------------------------------------------------

    def shape(
        self,
        profile: LinkProfile,
        direction: str,
        devices: list[LinkProfile] | None = None,
    ) -> AppliedShaping:
        """Shape the links (replacing what was there) in ``direction`` (both, up = device to
        server, down = server to device). On a star every device link gets ``profile``, or
        device ``i`` its own ``devices[i - 1]``; on a shared topology the shared access link
        gets ``profile`` and device ``i``'s link ``devices[i - 1]`` (unshaped without)."""
        if devices is not None and len(devices) != self.devices:
            raise TestbedError(f"{len(devices)} device profiles for {self.devices} devices")
        behind = PROFILES["none"] if self.shared else profile
        each = list(devices) if devices is not None else [behind] * self.devices
        nft = self.nft is not None
        plan = plan_shaping(profile, direction, self.netem, nft)
        plans = {p: plan_shaping(p, direction, self.netem, nft) for p in set(each)}
        up = direction in ("both", "up")
        down = direction in ("both", "down")
        losses: dict[str, dict[str, float]] = {node: {} for node in self.namespaces}
        for link in self.links():
            link_profile = profile if link.device == 0 else each[link.device - 1]
            link_plan = plan if link.device == 0 else plans[link_profile]
            self._set_qdisc(*link.near, link_profile, link_plan, apply=down)
            self._set_qdisc(*link.far, link_profile, link_plan, apply=up)
            if link_plan.loss_by == "nftables":
                # Loss is made where packets arrive: uplink at the near end, downlink far.
                if up:
                    losses[link.near[0]][link.near[1]] = link_profile.loss
                if down:
                    losses[link.far[0]][link.far[1]] = link_profile.loss
        for node, ifnames in losses.items():
            self._set_loss(node, ifnames)
        if not self.shared and devices is not None:  # no link has the profile itself
            plan = dataclasses.replace(
                plan, rate_by=None, loss_by=None, delay_applied=False, notes=()
            )
        return plan.combined(list(plans.values()), each, self.topology)

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

    def _set_loss(self, node: str, losses: dict[str, float]) -> None:
        """Replace ``node``'s loss table with a drop rule per interface of ``losses``."""
        losses = {ifname: loss for ifname, loss in losses.items() if loss}
        if not losses and node not in self._nft_tables:
            return
        assert self.nft is not None
        script = nft_loss_script(f"{self.prefix}loss", losses)
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
        if losses:
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
        roles = {(self.hub_node, self.bridge): BRIDGE}
        for i in range(1, self.devices + 1):
            roles[(self.hub_node, self.server_end(i))] = PORT
            roles[(device_node(i), self.device_end(i))] = DEVICE
        if self.shared:
            roles[(SERVER, self.uplink_server_end)] = SHARED_SERVER
            roles[(SWITCH, self.uplink_switch_end)] = SHARED_SWITCH
        links = []
        for node, ipr in self._ipr.items():
            for link in ipr.get_links():
                ifname = link.get_attr("IFLA_IFNAME")
                role = roles.get((node, ifname))
                if role is None:
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
                        "role": role,
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
