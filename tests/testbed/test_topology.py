"""Topologies and per-device links, measured with plain sockets in the namespaces: one shared
access link in front of the server, a switch on the devices' side of it whose traffic never
crosses it, and devices each on their own profile."""

from __future__ import annotations

from collections.abc import Iterator

import netload
import pytest
from testbed_support import require

from tensorwire.testbed import Capabilities, Testbed
from tensorwire.testbed.shaping import nft_loss_script

RATE_TOLERANCE = 0.15


@pytest.fixture(scope="module")
def shared(caps: Capabilities) -> Iterator[Testbed]:
    require(caps, "netns", "tbf")
    with Testbed(devices=2, profile="4g", topology="shared-broker-near") as tb:
        yield tb


def test_a_shared_topology_has_a_switch_beyond_one_shaped_access_link(shared: Testbed) -> None:
    shared.set_profile("4g")
    assert shared.nodes == ["srv", "dev1", "dev2", "sw"]
    assert shared.broker_node == "sw" and shared.switch_address == "10.211.0.254"
    assert shared.shaping.topology == "shared-broker-near" and "access link" in shared.label
    before = shared.counters()
    down = netload.tcp_transfer(shared, "srv", "dev2", port=7501, seconds=1.5)
    spent = shared.counters() - before
    roles = {link.role: link for link in spent.links.values()}
    print(f"shared 4g srv->dev2: {down['mbit']:.2f} Mbit/s")
    assert abs(down["mbit"] - 20.0) <= 20.0 * RATE_TOLERANCE, down
    # the bytes crossed the shared link, then dev2's own port
    assert roles["shared-server"].tx_bytes >= down["bytes"]
    ports = {link.ifname: link for link in spent.links.values() if link.role == "port"}
    assert (
        ports[f"{shared.prefix}s2"].tx_bytes
        >= down["bytes"]
        > 50 * ports[f"{shared.prefix}s1"].tx_bytes
    )


def test_the_switch_reaches_devices_without_crossing_the_shared_link(shared: Testbed) -> None:
    shared.set_profile("4g")
    before = shared.counters()
    fast = netload.tcp_transfer(shared, "sw", "dev1", port=7502, seconds=1.0)
    spent = shared.counters() - before
    shared_link = next(link for link in spent.links.values() if link.role == "shared-server")
    print(f"switch->dev1 behind a 4g access link: {fast['mbit']:.0f} Mbit/s")
    assert fast["mbit"] > 3 * 20.0, fast  # unshaped behind the access link
    assert shared_link.tx_bytes + shared_link.rx_bytes < fast["bytes"] / 100


def test_devices_get_their_own_links_behind_the_shared_one(shared: Testbed) -> None:
    shared.set_profile("wifi", links=["3g", "none"])
    try:
        assert [p.name for p in shared.shaping.devices] == ["3g", "none"]
        slow = netload.tcp_transfer(shared, "dev1", "srv", port=7503, seconds=1.5)
        fast = netload.tcp_transfer(shared, "dev2", "srv", port=7504, seconds=1.5)
    finally:
        shared.set_profile("4g")
    print(f"dev1 on 3g: {slow['mbit']:.2f}, dev2 behind wifi: {fast['mbit']:.2f} Mbit/s")
    assert abs(slow["mbit"] - 5.0) <= 5.0 * RATE_TOLERANCE, slow
    assert abs(fast["mbit"] - 60.0) <= 60.0 * 0.25, fast


def test_a_star_with_mixed_links_shapes_each_device_its_own_way(caps: Capabilities) -> None:
    require(caps, "netns", "tbf")
    with Testbed(devices=2, profile="4g", links=["3g", "4g"]) as tb:
        assert "devices 3g, 4g" in tb.label and tb.shaping.topology == "star"
        assert [p.rate for p in tb.shaping.devices] == [5e6, 20e6]
        one = netload.tcp_transfer(tb, "srv", "dev1", port=7505, seconds=1.5)
        two = netload.tcp_transfer(tb, "srv", "dev2", port=7506, seconds=1.5)
    print(f"star: dev1 3g {one['mbit']:.2f}, dev2 4g {two['mbit']:.2f} Mbit/s")
    assert abs(one["mbit"] - 5.0) <= 5.0 * RATE_TOLERANCE, one
    assert abs(two["mbit"] - 20.0) <= 20.0 * RATE_TOLERANCE, two


def test_bad_topologies_and_link_lists_are_refused_before_anything_is_built() -> None:
    with pytest.raises(ValueError, match="topology must be one of"):
        Testbed(devices=2, topology="ring")
    with pytest.raises(ValueError, match="3 link profiles for 2 devices"):
        Testbed(devices=2, links=["3g", "4g", "wifi"])


def test_loss_can_differ_per_interface() -> None:
    script = nft_loss_script("t", {"a": 0.1, "b": 0.0, "c": 0.02})
    assert 'device "a"' in script and "< 100000 " in script
    assert 'device "c"' in script and "< 20000 " in script
    assert 'device "b"' not in script  # no loss, no rule
