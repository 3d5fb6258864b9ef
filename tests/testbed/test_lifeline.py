"""A program a testbed starts ends when the process that started it is killed (SIGKILL: no
clean-up runs there), instead of going on until its own timeout, and the testbed's namespaces
go too, without waiting for the next testbed; a lifeline it was not given, or that is not a
pipe, is ignored. An AfterDeath helper runs its command only if its owner dies first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from pyroute2 import netns
from testbed_support import require

from tensorwire import _lifeline
from tensorwire.testbed import Capabilities
from tensorwire.testbed._named import remove_stale
from tensorwire.testbed._netns import _alive as running

# A device that keeps trying to reach a hub nobody serves, for a minute: without its lifeline
# it would outlive the killed parent by that long.
DEVICE = ["-m", "tensorwire", "fl", "client", "--url", "tcp://127.0.0.1:9", "--id", "1"]
DEVICE += ["--timeout", "60"]

PARENT = textwrap.dedent(
    """
    import json, sys, time
    from tensorwire.testbed import LoopbackTestbed, Testbed
    argv = [sys.executable, *json.loads(sys.argv[2])]
    if sys.argv[1] == "loopback":
        tb = LoopbackTestbed(devices=1).open()
    else:
        tb = Testbed(devices=1).open()
    device = tb.popen("dev1", argv)
    print(json.dumps({"device": device.pid, "prefix": getattr(tb, "prefix", "")}), flush=True)
    time.sleep(120)
    """
)


def kill_parent_and_wait(kind: str, hung: bool = False) -> tuple[float, str]:
    """Start a parent with a testbed and a device in it, SIGKILL the parent; return how long
    the device took to end (it may not even watch its lifeline yet when the parent dies:
    end-of-file waits in the pipe until it does), and the testbed's prefix. ``hung``: the
    device is SIGSTOPped first, so it cannot act on its lifeline."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, kind, json.dumps(DEVICE)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    try:
        started = json.loads(parent.stdout.readline())
        device = started["device"]
        time.sleep(1)  # killed before or after it watches: the pipe's end stays
        assert running(device), "the device ended before its parent was killed"
        if hung:
            os.kill(device, signal.SIGSTOP)
    finally:
        parent.kill()
        parent.wait(timeout=30)
    start = time.monotonic()
    while running(device) and time.monotonic() - start < 30:
        time.sleep(0.05)
    if running(device):
        os.kill(device, 9)
        pytest.fail("the device outlived its killed parent by 30 s")
    return time.monotonic() - start, started["prefix"]


def test_a_device_ends_with_its_killed_parent_on_loopback() -> None:
    assert kill_parent_and_wait("loopback")[0] < 10


@pytest.mark.parametrize("hung", [False, True], ids=["device-running", "device-stopped"])
def test_a_killed_parents_device_and_namespaces_end_in_a_namespace(
    caps: Capabilities, hung: bool
) -> None:
    """The device ends by its lifeline, or (stopped: it cannot read it) by the sweep of the
    killed parent's namespaces, which kills what runs in them."""
    require(caps, "netns", "root")
    try:
        took, prefix = kill_parent_and_wait("netns", hung)
        assert took < 10
        assert prefix.startswith("twb-")

        def mine() -> list[str]:
            return [n for n in netns.listnetns() if n.startswith(prefix)]

        deadline = time.monotonic() + 20
        while mine() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not mine(), f"the killed parent's namespaces outlived it by 20 s: {mine()}"
    finally:
        remove_stale()  # if they did not go: as the next testbed would


def test_after_death_runs_its_command_only_when_its_owner_dies(tmp_path) -> None:
    """Stopped by a living owner, the command never runs; the owner killed, it runs."""
    code = textwrap.dedent(
        """
        import sys, time
        from tensorwire._lifeline import AfterDeath
        touch = [sys.executable, "-c", f"open({sys.argv[1]!r}, 'w').close()"]
        helper = AfterDeath(touch)
        if sys.argv[2] == "stop":
            helper.stop()
            time.sleep(0.5)
        else:
            print("ready", flush=True)
            time.sleep(60)
        """
    )
    stopped, killed = tmp_path / "stopped", tmp_path / "killed"
    subprocess.run([sys.executable, "-c", code, str(stopped), "stop"], check=True, timeout=60)
    owner = subprocess.Popen(
        [sys.executable, "-c", code, str(killed), "kill"], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None and owner.stdout.readline() == "ready\n"
    assert not killed.exists()  # waits while its owner lives
    owner.kill()
    owner.wait(timeout=30)
    deadline = time.monotonic() + 20
    while not killed.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert killed.exists()
    assert not stopped.exists()


def test_a_child_of_a_living_parent_keeps_running() -> None:
    """The lifeline holds while the parent lives: a child it started keeps running."""
    options = _lifeline.child_options({"stdout": subprocess.PIPE, "text": True})
    code = "from tensorwire._lifeline import watch_parent; import time;"
    code += "print(watch_parent(), flush=True); time.sleep(2); print('alive', flush=True)"
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, **options)
    assert proc.stdout.split() == ["True", "alive"]


@pytest.mark.parametrize("value", ["not-a-number", "0", "999"])
def test_a_lifeline_that_is_none_is_ignored(value: str) -> None:
    """A variable that names no descriptor, or one that is not a pipe (stdin here is
    /dev/null), is not watched: the process runs as without it."""
    env = {**os.environ, _lifeline.ENV: value}
    code = "from tensorwire._lifeline import watch_parent; import os;"
    code += f"print(watch_parent(), os.environ.get({_lifeline.ENV!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "None"]
