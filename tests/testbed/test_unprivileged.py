"""Without privileges: the testbed in an unprivileged user namespace, and the loopback one."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import netload
import pytest
from testbed_support import require

from tensorwire.testbed import (
    Capabilities,
    LoopbackTestbed,
    ShapingUnavailable,
    cpu_stress,
)
from tensorwire.testbed.capabilities import is_privileged

NOBODY = 65534
USERNS_RUN = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import netload
    from tensorwire.testbed import Testbed, probe_capabilities
    caps = probe_capabilities()
    if caps.mode != "userns":
        print(json.dumps({"skip": caps.report()}))
        raise SystemExit
    with Testbed(devices=2, profile="4g") as tb:
        up = netload.tcp_transfer(tb, "dev1", "srv", port=7501, seconds=1.5)
        tb.set_profile("lan,loss=10%")
        recv = netload.start(tb, "srv", "udp-recv", 7502, 500, 0.5)
        tb.wait_listening("srv", 7502, protocol="udp")
        send = netload.start(tb, "dev2", "udp-send", tb.server_address, 7502, 500, 0.0005)
        netload.run(send)
        received = netload.run(recv)["received"]
        counters = tb.counters()
        print(json.dumps({"mode": tb.mode, "uid": __import__("os").getuid(), "up": up["mbit"],
                          "received": received, "links": sorted(counters.links)}))
    """
)


def as_nobody(argv: list[str], scratch: str) -> list[str]:
    """``argv`` run as user nobody with no capabilities. Where this interpreter lives under a
    directory nobody may not enter (/root, with pyenv), a private mount namespace shows it
    (``scratch``: an empty directory to stage the bind mount in)."""
    run_as = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
        *argv,
    ]
    real = Path(os.path.realpath(sys.executable))
    if not (real.is_relative_to("/root") and not Path("/root").stat().st_mode & stat.S_IXOTH):
        return run_as
    exposed = Path("/root", real.relative_to("/root").parts[0])
    script = (
        f"mount --bind {exposed} {scratch} && mount -t tmpfs -o mode=755 tmpfs /root && "
        f"mkdir {exposed} && mount --move {scratch} {exposed} && exec {shlex.join(run_as)}"
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def test_user_namespace_testbed(caps: Capabilities) -> None:
    require(caps, "netns", "tbf", "nft_netdev")
    if not is_privileged():
        pytest.skip("needs root to switch to an unprivileged user for the test")
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(
            as_nobody(
                [sys.executable, "-c", USERNS_RUN, str(Path(netload.__file__).parent)], scratch
            ),
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(f"no unprivileged user namespaces here:\n{result['skip']}")
    lost = 1 - result["received"] / 500
    print(
        f"userns testbed as uid {result['uid']}: 4g up {result['up']:.2f} Mbit/s, "
        f"loss {lost:.1%} at 10 %"
    )
    assert result["mode"] == "userns" and result["uid"] == NOBODY
    assert abs(result["up"] - 20) <= 3
    assert 0.04 <= lost <= 0.18
    assert any(name.endswith("d1") for name in result["links"])


def test_loopback_testbed_is_labelled_and_works(caps: Capabilities) -> None:
    with LoopbackTestbed(devices=2) as tb:
        assert tb.label == "unshaped loopback" and tb.shaped is False
        assert tb.server_address == "127.0.0.1" and tb.device_namespaces == []
        assert tb.url("tcp", 5000) == "tcp://127.0.0.1:5000"
        result = netload.tcp_transfer(tb, "dev1", "srv", port=7601, seconds=0, nbytes=1_000_000)
        assert result["bytes"] == 1_000_000
        counters = tb.counters()
        assert counters.label == "unshaped loopback" and not counters.shaped
        assert all(row["label"] == "unshaped loopback" for row in counters.rows())
        assert "unshaped loopback" in tb.shaping.notes[0]
        with pytest.raises(ShapingUnavailable, match="unshaped loopback"):
            tb.set_profile("4g")
        if caps.has("tool:stress-ng"):
            with cpu_stress(tb, nodes=["dev1"], seconds=1) as stress:
                assert stress.wait(timeout=5)
    with pytest.raises(ShapingUnavailable):
        LoopbackTestbed(profile="3g")
