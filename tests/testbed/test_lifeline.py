"""A program a testbed starts ends when the process that started it is killed (SIGKILL: no
clean-up runs there), instead of going on until its own timeout; a lifeline it was not given,
or that is not a pipe, is ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
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
    print(json.dumps({"device": device.pid}), flush=True)
    time.sleep(120)
    """
)


def kill_parent_and_wait(kind: str) -> float:
    """Start a parent with a testbed and a device in it, SIGKILL the parent; return how long
    the device took to end (it may not even watch its lifeline yet when the parent dies:
    end-of-file waits in the pipe until it does)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, kind, json.dumps(DEVICE)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    try:
        device = json.loads(parent.stdout.readline())["device"]
        time.sleep(1)  # killed before or after it watches: the pipe's end stays
        assert running(device), "the device ended before its parent was killed"
    finally:
        parent.kill()
        parent.wait(timeout=30)
    start = time.monotonic()
    while running(device) and time.monotonic() - start < 30:
        time.sleep(0.05)
    if running(device):
        os.kill(device, 9)
        pytest.fail("the device outlived its killed parent by 30 s")
    return time.monotonic() - start


def test_a_device_ends_with_its_killed_parent_on_loopback() -> None:
    assert kill_parent_and_wait("loopback") < 10


def test_a_device_ends_with_its_killed_parent_in_a_namespace(caps: Capabilities) -> None:
    require(caps, "netns", "root")
    try:
        assert kill_parent_and_wait("netns") < 10
    finally:
        remove_stale()  # the killed parent's namespaces, as the next testbed would


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
