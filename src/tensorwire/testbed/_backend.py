"""A testbed backend: namespaces plus the fabric of links in them, built, shaped, measured.

``LocalBackend`` does the work in this process (root, or the agent inside a user namespace);
``tensorwire.testbed._userns.AgentBackend`` has the same methods and asks an agent to.
"""

from __future__ import annotations

from typing import Any, Protocol

from tensorwire.testbed._fabric import Fabric
from tensorwire.testbed._netns import Netns
from tensorwire.testbed.profile import LinkProfile
from tensorwire.testbed.shaping import AppliedShaping


class NamespaceProvider(Protocol):
    """Creates the namespaces of a testbed's nodes and destroys them with what runs inside."""

    def create(self) -> dict[str, Netns]: ...

    def destroy(self) -> None: ...


class Backend(Protocol):
    """What :class:`~tensorwire.testbed.Testbed` needs from where the namespaces live."""

    namespaces: dict[str, Netns]

    def address(self, node: str) -> str: ...

    def shape(
        self, profile: LinkProfile, direction: str, devices: list[LinkProfile] | None = None
    ) -> AppliedShaping: ...

    def counters(self) -> dict[str, Any]: ...

    def proc_net(self, node: str, name: str) -> str: ...

    def set_link_state(self, device: int, up: bool) -> None: ...

    def close(self) -> None: ...


class LocalBackend:
    """Namespaces from ``provider`` and a :class:`Fabric` in them, driven from this process.

    ``netem`` / ``nft``: whether the kernel has netem, and the nft program if nftables' netdev
    hook works (from :func:`probe_capabilities`); ``topology`` one of
    :data:`~tensorwire.testbed.shaping.TOPOLOGIES` (a shared one needs an ``sw`` node)."""

    def __init__(
        self,
        provider: NamespaceProvider,
        prefix: str,
        subnet: str,
        netem: bool,
        nft: str | None,
        topology: str = "star",
    ) -> None:
        self._provider = provider
        self.namespaces = provider.create()
        try:
            self._fabric = Fabric(
                self.namespaces, prefix, subnet, netem=netem, nft=nft, topology=topology
            )
            self._fabric.build()
        except BaseException:
            self.close()
            raise

    def address(self, node: str) -> str:
        return self._fabric.address(node)

    def shape(
        self, profile: LinkProfile, direction: str, devices: list[LinkProfile] | None = None
    ) -> AppliedShaping:
        return self._fabric.shape(profile, direction, devices)

    def counters(self) -> dict[str, Any]:
        return self._fabric.counters()

    def proc_net(self, node: str, name: str) -> str:
        return self._fabric.proc_net(node, name)

    def set_link_state(self, device: int, up: bool) -> None:
        self._fabric.set_link_state(device, up)

    def close(self) -> None:
        fabric = getattr(self, "_fabric", None)
        if fabric is not None:
            fabric.close()
        self._provider.destroy()
