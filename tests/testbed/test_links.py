"""Shaped links measured with plain sockets in processes inside the namespaces: rate in both
directions, loss, and the counters that see them."""

from __future__ import annotations

import subprocess
import warnings

import netload
import pytest
from testbed_support import require

from tensorwire.testbed import Capabilities, ShapingWarning, Testbed, TestbedError

RATE_TOLERANCE = 0.15  # goodput within 15 % of the link rate (headers take ~4.5 % of it)


@pytest.mark.parametrize("sender,receiver", [("dev1", "srv"), ("srv", "dev1")], ids=["up", "down"])
def test_4g_rate_both_directions(testbed: Testbed, sender: str, receiver: str) -> None:
    testbed.set_profile("4g")
    result = netload.tcp_transfer(testbed, sender, receiver, port=7101, seconds=3.0)
    print(f"4g {sender}->{receiver}: {result['mbit']:.2f} Mbit/s goodput")
    assert abs(result["mbit"] - 20.0) <= 20.0 * RATE_TOLERANCE, result


def test_lan_is_much_faster_than_4g(testbed: Testbed) -> None:
    testbed.set_profile("lan")
    result = netload.tcp_transfer(testbed, "dev2", "srv", port=7102, seconds=1.0)
    print(f"lan dev2->srv: {result['mbit']:.0f} Mbit/s goodput")
    assert result["mbit"] > 5 * 20.0, result


def test_one_direction_only(testbed: Testbed) -> None:
    testbed.set_profile("3g", direction="up")
    try:
        up = netload.tcp_transfer(testbed, "dev1", "srv", port=7103, seconds=1.5)
        down = netload.tcp_transfer(testbed, "srv", "dev1", port=7104, seconds=0.5)
    finally:
        testbed.set_profile("none", direction="both")
    print(f"3g up only: up {up['mbit']:.2f}, down {down['mbit']:.0f} Mbit/s")
    assert abs(up["mbit"] - 5.0) <= 5.0 * RATE_TOLERANCE, up
    assert down["mbit"] > 4 * 5.0, down  # unshaped: far above 3g (CPU-bound without GSO)


def test_nftables_loss_device_to_server(caps: Capabilities, testbed: Testbed) -> None:
    require(caps, "nft_netdev")
    testbed.set_profile("lan,loss=10%")
    assert testbed.shaping.loss_by == ("netem" if caps.has("netem") else "nftables")
    count = 1000
    recv = netload.start(testbed, "srv", "udp-recv", 7201, count, 0.5)
    testbed.wait_listening("srv", 7201, protocol="udp")
    send = netload.start(testbed, "dev1", "udp-send", testbed.server_address, 7201, count, 0.0005)
    netload.run(send)
    lost = 1 - netload.run(recv)["received"] / count
    print(f"loss=10% profile: {lost:.1%} of {count} datagrams lost device->server")
    assert 0.06 <= lost <= 0.14


def test_retransmissions_rise_under_loss(caps: Capabilities, testbed: Testbed) -> None:
    require(caps, "nft_netdev")
    testbed.set_profile("4g")
    before = testbed.counters()
    netload.tcp_transfer(testbed, "dev1", "srv", port=7301, seconds=1.5)
    clean = testbed.counters() - before
    testbed.set_profile("4g,loss=5%")
    before = testbed.counters()
    netload.tcp_transfer(testbed, "dev1", "srv", port=7302, seconds=1.5)
    lossy = testbed.counters() - before
    print(
        f"RetransSegs dev1: {clean.tcp_retrans_segs['dev1']} without loss, "
        f"{lossy.tcp_retrans_segs['dev1']} at 5 % loss"
    )
    assert lossy.tcp_retrans_segs["dev1"] > clean.tcp_retrans_segs["dev1"] + 10
    assert lossy.tcp_out_segs["dev1"] > 0 and lossy.label == testbed.label and lossy.shaped


def test_link_bytes_match_a_known_transfer(testbed: Testbed) -> None:
    testbed.set_profile("lan")
    payload = 4_000_000
    before = testbed.counters()
    result = netload.tcp_transfer(testbed, "dev2", "srv", port=7401, seconds=0, nbytes=payload)
    spent = testbed.counters() - before
    assert result["bytes"] == payload
    device_end = spent.links[f"{testbed.prefix}d2"]
    server_end = spent.links[f"{testbed.prefix}s2"]
    print(f"{payload} B payload: {device_end.tx_bytes} B / {device_end.tx_packets} packets sent")
    assert payload <= device_end.tx_bytes <= 1.1 * payload
    assert server_end.rx_bytes == device_end.tx_bytes
    assert spent.links[f"{testbed.prefix}d1"].tx_bytes < 10_000  # the other device was idle
    rows = spent.rows()
    assert {r["kind"] for r in rows} == {"tcp", "link"} and all(r["shaped"] for r in rows)


def test_delay_without_netem_is_reported(caps: Capabilities, testbed: Testbed) -> None:
    if caps.has("netem"):
        pytest.skip("this kernel has netem: delay is applied, nothing to report")
    with pytest.warns(ShapingWarning, match="NOT applied"):
        testbed.set_profile("4g,delay=40ms")
    assert not testbed.shaping.delay_applied
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        testbed.set_profile("none")


def test_a_device_interface_is_the_one_its_node_has(testbed: Testbed) -> None:
    for node in testbed.device_nodes:
        names = subprocess.run(
            testbed.command(node, ["cat", "/proc/net/dev"]),
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        assert f"{testbed.interface(node)}:" in names
    with pytest.raises(TestbedError, match="not a device"):
        testbed.interface("srv")
