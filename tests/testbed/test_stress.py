"""Stressors start, load what they should, end within their time limits and leave nothing."""

from __future__ import annotations

import time

import pytest
from testbed_support import require

from tensorwire.testbed import Capabilities, MissingTool, Testbed, cpu_stress, network_stress
from tensorwire.testbed._netns import pids_in
from tensorwire.testbed._tools import require_tool


def processes_in(testbed: Testbed, node: str) -> list[int]:
    """Processes inside ``node``'s namespace."""
    return pids_in([testbed._ready().namespaces[node].path])


def test_cpu_stress_ends_by_itself(caps: Capabilities, testbed: Testbed) -> None:
    require(caps, "tool:stress-ng")
    start = time.monotonic()
    with cpu_stress(testbed, nodes=["dev1", "dev2"], workers=1, seconds=2) as stress:
        time.sleep(0.5)
        assert stress.running and processes_in(testbed, "dev1")
        assert stress.wait(timeout=6)
    took = time.monotonic() - start
    print(f"cpu_stress(2 s) ended after {took:.2f} s")
    assert 1.5 <= took <= 5
    assert processes_in(testbed, "dev1") == [] and processes_in(testbed, "dev2") == []


def test_cpu_stress_stops_early(caps: Capabilities, testbed: Testbed) -> None:
    require(caps, "tool:stress-ng")
    stress = cpu_stress(testbed, nodes=["dev1"], workers=2, seconds=30)
    time.sleep(0.3)
    start = time.monotonic()
    stress.stop()
    assert not stress.running and time.monotonic() - start < 4
    assert processes_in(testbed, "dev1") == []


def test_network_stress_loads_the_link_and_ends(caps: Capabilities, testbed: Testbed) -> None:
    require(caps, "tool:iperf3")
    testbed.set_profile("4g")
    start = time.monotonic()
    with network_stress(testbed, seconds=2, flows=2) as stress:
        assert stress.wait(timeout=10)
    took = time.monotonic() - start
    results = stress.results()
    rates = {node: r["sum_received"]["bits_per_second"] / 1e6 for node, r in results.items()}
    print(f"network_stress(250 Mbit/s offered, 2 s) at 4g: {rates} Mbit/s, {took:.2f} s")
    assert set(rates) == {"dev1", "dev2"}
    assert all(10 < rate < 22 for rate in rates.values())  # the 4g link, not the offered 250
    assert took < 2 + 6
    assert all(processes_in(testbed, n) == [] for n in testbed.nodes)


def test_network_stress_stops_early(caps: Capabilities, testbed: Testbed) -> None:
    require(caps, "tool:iperf3")
    testbed.set_profile("4g")
    stress = network_stress(testbed, nodes=["dev2"], seconds=30, reverse=True)
    time.sleep(1.0)
    assert stress.running
    stress.stop()
    assert not stress.running
    assert all(processes_in(testbed, n) == [] for n in testbed.nodes)


def test_missing_tool_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tensorwire.testbed._tools.find_tool", lambda name: None)
    with pytest.raises(MissingTool, match="apt-get install -y stress-ng"):
        require_tool("stress-ng")
