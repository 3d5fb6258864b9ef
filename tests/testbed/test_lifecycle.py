"""A testbed creates its namespaces, links and rules and removes every one of them: on a
normal exit, after an exception in the with-block, on SIGTERM, and after a SIGKILL (the next
testbed removes what the killed one left)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from testbed_support import require

from tensorwire.testbed import Capabilities, NamespacesUnavailable, Testbed, _named


def leftovers(prefix: str) -> list[str]:
    """Namespaces, root-namespace links, nftables tables and lock files carrying ``prefix``."""
    found = (
        [n for n in os.listdir("/run/netns") if n.startswith(prefix)]
        if Path("/run/netns").is_dir()
        else []
    )
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [line.split(":")[1].strip() for line in links.splitlines() if prefix in line]
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    found += [line for line in tables.splitlines() if prefix in line]
    found += [str(p) for p in Path("/run/tensorwire-testbed").glob(f"{prefix}*")]
    return found


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_capabilities_report(caps: Capabilities) -> None:
    report = caps.report()
    for name in ("root", "netns", "tool:iperf3"):
        assert name in report
    if caps.has("netns"):
        assert "netem" in report and caps.mode in ("root", "userns")
        assert caps.loss_by in ("netem", "nftables", None)


def test_creates_and_removes_everything(caps: Capabilities) -> None:
    require(caps, "netns", "tbf")
    with Testbed(devices=2, profile="4g,loss=5%") as tb:
        prefix = tb.prefix
        assert tb.device_namespaces == [f"{prefix}dev1", f"{prefix}dev2"]
        assert tb.server_address == "10.211.0.1"
        assert [tb.address(n) for n in tb.device_nodes] == ["10.211.0.2", "10.211.0.3"]
        if tb.mode == "root":
            assert {tb.server_namespace, *tb.device_namespaces} <= set(os.listdir("/run/netns"))
        sleeper = tb.popen("dev1", ["sleep", "30"])
        # A second testbed's stale sweep must leave this live one alone.
        with Testbed(devices=1) as other:
            assert other.prefix != prefix
            probe = tb.popen(tb.namespace("dev2"), ["true"])
            assert probe.wait(timeout=10) == 0
    assert sleeper.poll() is not None
    assert leftovers(prefix) == []


def test_removes_everything_after_an_exception(caps: Capabilities) -> None:
    require(caps, "netns", "tbf")
    prefix = ""
    with pytest.raises(RuntimeError, match="boom"), Testbed(2, profile="3g,loss=1%") as tb:
        prefix = tb.prefix
        tb.popen("srv", ["sleep", "30"])
        raise RuntimeError("boom")
    assert prefix and leftovers(prefix) == []


CRASHER = textwrap.dedent(
    """
    import json, sys, time
    from tensorwire.testbed import Testbed
    tb = Testbed(devices=2, profile="4g,loss=1%", prefix=sys.argv[1]).open()
    sleeper = tb.popen("dev1", ["sleep", "60"])
    print(json.dumps({"sleeper": sleeper.pid}), flush=True)
    time.sleep(60)
    """
)


def start_crasher(prefix: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHER, prefix], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the crasher did not start its testbed"
    return proc, json.loads(line)["sleeper"]


def test_sigterm_removes_everything(caps: Capabilities) -> None:
    require(caps, "netns", "tbf", "root")
    prefix = f"twb-t{secrets.token_hex(2)}-"
    proc, sleeper = start_crasher(prefix)
    assert leftovers(prefix)
    proc.terminate()
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert leftovers(prefix) == []
    assert gone(sleeper)


def test_next_testbed_removes_what_a_killed_one_left(caps: Capabilities) -> None:
    require(caps, "netns", "tbf", "root")
    prefix = f"twb-k{secrets.token_hex(2)}-"
    proc, sleeper = start_crasher(prefix)
    proc.kill()
    proc.wait(timeout=30)
    assert any(name.endswith("srv") for name in leftovers(prefix)), "SIGKILL left nothing?"
    with Testbed(devices=1):
        assert leftovers(prefix) == []
    assert gone(sleeper)


def test_a_sweep_in_progress_is_waited_for_not_taken_for_a_live_testbed(
    caps: Capabilities,
) -> None:
    """Another process sweeping a killed testbed holds its lock for a while: the next testbed
    waits for that sweep instead of leaving the killed one's leftovers to a live owner."""
    require(caps, "netns", "tbf", "root")
    prefix = f"twb-w{secrets.token_hex(2)}-"
    proc, sleeper = start_crasher(prefix)
    holding, killed = threading.Event(), threading.Event()

    def slow_sweep() -> None:
        with _named._sweeping():
            holding.set()
            killed.wait(timeout=30)
            gone, fd = _named._lock_of_dead(prefix)
            assert gone and fd is not None
            time.sleep(0.5)  # the sweep's own work, holding the dead testbed's lock
            os.close(fd)
            _named._remove_stale_now()

    sweeper = threading.Thread(target=slow_sweep)
    sweeper.start()
    try:
        assert holding.wait(timeout=30)
        proc.kill()
        proc.wait(timeout=30)
        assert leftovers(prefix), "SIGKILL left nothing?"
        killed.set()
        with Testbed(devices=1):
            assert leftovers(prefix) == []
    finally:
        killed.set()
        sweeper.join(timeout=60)
    assert gone(sleeper)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="prefix"):
        Testbed(prefix="mine-")
    with pytest.raises(ValueError, match="prefix"):
        Testbed(prefix="twb-much-too-long-")
    with pytest.raises(ValueError, match="direction"):
        Testbed(direction="sideways")
    with pytest.raises(ValueError, match="devices"):
        Testbed(devices=0)


def test_unavailable_is_typed() -> None:
    assert issubclass(NamespacesUnavailable, PermissionError)
