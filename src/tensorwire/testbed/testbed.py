"""The network-namespace testbed: a server and N devices on shaped links.

One network namespace per node (``PREFIXsrv``, ``PREFIXdev1`` ...), a veth link per device,
the server ends bridged so every device reaches the server at one address (10.211.0.1 by
default). On a shared topology a switch node (``PREFIXsw``) holds the bridge, and one access
link joins it to the server. As root the namespaces are named (``ip netns list`` shows them);
otherwise an agent in an unprivileged user namespace holds them (see ``_userns``). Everything
carries the prefix and is removed on close, at exit, on SIGTERM/SIGHUP, or, after a crash, by
the next testbed.
"""

from __future__ import annotations

import re
import secrets
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tensorwire.errors import MissingDependency
from tensorwire.testbed._netns import BASE_PREFIX
from tensorwire.testbed._tools import find_tool
from tensorwire.testbed.base import BaseTestbed
from tensorwire.testbed.capabilities import probe_capabilities
from tensorwire.testbed.counters import Counters
from tensorwire.testbed.errors import NamespacesUnavailable, ShapingWarning, TestbedError
from tensorwire.testbed.profile import LinkProfile, as_profile
from tensorwire.testbed.shaping import DIRECTIONS, TOPOLOGIES, AppliedShaping

if TYPE_CHECKING:
    from tensorwire.testbed._backend import Backend

MAX_PREFIX = 11  # so that PREFIX + "s999" fits an interface name (15 characters)
SWITCH = "sw"


class Testbed(BaseTestbed):
    """``devices`` devices and a server in network namespaces, links shaped with ``profile``
    (a :class:`LinkProfile`, a name such as ``"4g"`` or ``"20mbit,loss=5%"``) in ``direction``
    (``both``, ``up`` = device to server, ``down``). Use as a context manager::

        with Testbed(devices=4, profile="4g") as tb:
            server = tb.popen("srv", [python, "-m", "my.server", tb.url("tcp", 5000)])
            ...
            tb.set_profile("3g")   # between experiments
            before = tb.counters(); ...; spent = tb.counters() - before

    ``prefix`` (default ``twb-`` + a random run id + ``-``) starts every namespace, interface
    and nftables table name; it must start with ``twb-``, end with ``-`` and be at most 11
    characters of a-z, 0-9 and ``-``. :class:`NamespacesUnavailable` if this process may not
    create namespaces: :class:`LoopbackTestbed` then offers an unshaped loopback run.

    ``topology``: ``star`` (a shaped link per device), ``shared`` (the server reaches every
    device through one access link shaped with ``profile``, as an edge server on one uplink
    does; the devices' own links behind it unshaped unless ``links`` are given) or
    ``shared-broker-near`` (the same links; a broker belongs in the switch node ``sw``, on the
    devices' side of the access link, at :attr:`switch_address`). ``links``: one profile per
    device (``["3g", "4g", "4g", "wifi"]``), each device's own link (on a star instead of
    ``profile``)."""

    shaped = True

    def __init__(
        self,
        devices: int = 2,
        profile: LinkProfile | str | None = "none",
        direction: str = "both",
        prefix: str | None = None,
        subnet: str = "10.211.0.0/24",
        topology: str = "star",
        links: Sequence[LinkProfile | str] | None = None,
    ) -> None:
        super().__init__(devices)
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, not {topology!r}")
        self.topology = topology
        self.prefix = prefix or f"{BASE_PREFIX}{secrets.token_hex(3)}-"
        if (
            not re.fullmatch(re.escape(BASE_PREFIX) + r"[a-z0-9-]*-", self.prefix)
            or len(self.prefix) > MAX_PREFIX
        ):
            raise ValueError(
                f"prefix {self.prefix!r}: must start with {BASE_PREFIX!r}, end with '-', use "
                f"a-z 0-9 - only and be at most {MAX_PREFIX} characters"
            )
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
        self.subnet = subnet
        self._initial = (as_profile(profile), direction, self._device_profiles(links))
        self._backend: Backend | None = None
        self._shaping: AppliedShaping | None = None
        self._mode = ""

    def open(self) -> Testbed:
        """Create namespaces, links and shaping; on any failure remove what was made."""
        caps = probe_capabilities()
        if caps.mode is None:
            reasons = "; ".join(
                caps[name].reason for name in ("root", "userns", "netns") if name in caps.items
            )
            raise NamespacesUnavailable(
                f"cannot create network namespaces here: {reasons}. Run as root, or allow "
                "unprivileged user namespaces, or use LoopbackTestbed for an unshaped "
                "loopback run (labelled as such)."
            )
        try:
            from tensorwire.testbed._backend import LocalBackend
            from tensorwire.testbed._named import NamedNamespaces, remove_stale
            from tensorwire.testbed._userns import AgentBackend
        except ImportError as exc:
            raise MissingDependency(
                f"the namespace testbed needs pyroute2 ({exc}): pip install 'tensorwire[bench]'"
            ) from exc
        super().open()
        try:
            nft = find_tool("nft") if caps.has("nft_netdev") else None
            self._mode = caps.mode
            if caps.mode == "root":
                remove_stale()
                self._backend = LocalBackend(
                    NamedNamespaces(self.prefix, self.nodes),
                    self.prefix,
                    self.subnet,
                    netem=caps.has("netem"),
                    nft=nft,
                    topology=self.topology,
                )
            else:
                self._backend = AgentBackend(
                    self.prefix,
                    self.nodes,
                    self.subnet,
                    netem=caps.has("netem"),
                    nft=nft,
                    topology=self.topology,
                )
            profile, direction, links = self._initial
            self.set_profile(profile, direction, links=links)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop processes started in the nodes, remove namespaces, links and rules."""
        try:
            super().close()
        finally:
            if self._backend is not None:
                backend, self._backend = self._backend, None
                backend.close()

    @property
    def mode(self) -> str:
        """``root`` (named namespaces) or ``userns`` (an unprivileged user namespace); set
        when the testbed opens."""
        return self._mode

    @property
    def label(self) -> str:
        """What every output of this testbed is labelled with, e.g. ``netns 4g: 20 Mbit/s``
        (with the topology and the devices' own links where they are not a plain star)."""
        shaping = self.shaping
        label = f"netns {shaping.profile.describe()}"
        if self.shared:
            label += f", {self.topology} access link"
        if shaping.devices and any(p != shaping.devices[0] for p in shaping.devices):
            label += "; devices " + ", ".join(p.name for p in shaping.devices)
        elif (
            shaping.devices and shaping.devices[0].shaped and shaping.devices[0] != shaping.profile
        ):
            label += f"; devices {shaping.devices[0].describe()}"
        return label

    # --- nodes ----------------------------------------------------------------------------

    @property
    def shared(self) -> bool:
        """Whether one access link joins the server to every device (a shared topology)."""
        return self.topology != "star"

    @property
    def nodes(self) -> list[str]:
        """``["srv", "dev1", ..., "devN"]``, and ``"sw"`` last on a shared topology."""
        return [*super().nodes, *([SWITCH] if self.shared else [])]

    @property
    def broker_node(self) -> str:
        """Where a broker belongs: the switch on ``shared-broker-near``, else the server."""
        return SWITCH if self.topology == "shared-broker-near" else "srv"

    @property
    def switch_address(self) -> str:
        """The switch's address (shared topologies): where a broker near the devices listens."""
        if not self.shared:
            raise TestbedError("a star topology has no switch")
        return self.address(SWITCH)

    def _ready(self) -> Backend:
        if self._backend is None:
            raise TestbedError("the testbed is not open; use it in a with block")
        return self._backend

    def address(self, node: str) -> str:
        return self._ready().address(self.node(node))

    def namespace(self, node: str) -> str:
        """The network namespace name of ``node``."""
        return f"{self.prefix}{self.node(node)}"

    def _namespace_name(self, node: str) -> str | None:
        return f"{self.prefix}{node}"

    def interface(self, node: str) -> str:
        """The interface a device node's traffic leaves by (its end of its link), e.g. for
        a program that must be told which interface to use (gloo's ``GLOO_SOCKET_IFNAME``)."""
        from tensorwire.testbed._fabric import device_interface

        found = self.node(node)
        if found not in self.device_nodes:
            raise TestbedError(f"{node!r} is not a device; devices are {self.device_nodes}")
        return device_interface(self.prefix, int(found.removeprefix("dev")))

    @property
    def server_namespace(self) -> str:
        return self.namespace("srv")

    @property
    def device_namespaces(self) -> list[str]:
        """The namespace names of the devices, in order."""
        return [self.namespace(node) for node in self.device_nodes]

    def _enter(self, node: str) -> tuple[str, ...]:
        return self._ready().namespaces[node].enter

    def _proc_net(self, node: str, name: str) -> str:
        return self._ready().proc_net(node, name)

    # --- links ----------------------------------------------------------------------------

    @property
    def shaping(self) -> AppliedShaping:
        if self._shaping is None:
            raise TestbedError("the testbed is not open; use it in a with block")
        return self._shaping

    def set_profile(
        self,
        profile: LinkProfile | str,
        direction: str | None = None,
        *,
        links: Sequence[LinkProfile | str] | None = None,
    ) -> None:
        """Shape the links with ``profile`` (replacing the current shaping) in ``direction``
        (default: as before): every device link on a star, the shared access link on a shared
        topology. ``links`` (one profile per device) give each device's own link a profile:
        instead of ``profile`` on a star, behind the shared link otherwise (unshaped without).
        Parts this kernel cannot apply (delay without netem) are left out with a
        :class:`ShapingWarning` and a note in :attr:`shaping`."""
        direction = direction or (self._shaping.direction if self._shaping else "both")
        devices = self._device_profiles(links)
        self._shaping = self._ready().shape(as_profile(profile), direction, devices)
        for note in self._shaping.notes:
            if "NOT applied" in note:
                warnings.warn(note, ShapingWarning, stacklevel=2)

    def _device_profiles(
        self, links: Sequence[LinkProfile | str] | None
    ) -> list[LinkProfile] | None:
        if links is None:
            return None
        if len(links) != self.devices:
            raise ValueError(f"{len(links)} link profiles for {self.devices} devices")
        return [as_profile(link) for link in links]

    def counters(self) -> Counters:
        return Counters.from_raw(self._ready().counters(), label=self.label, shaped=True)

    def set_link_state(self, device: int, up: bool) -> None:
        if not 1 <= device <= self.devices:
            raise ValueError(f"device {device}: this testbed has devices 1..{self.devices}")
        self._ready().set_link_state(device, up)
