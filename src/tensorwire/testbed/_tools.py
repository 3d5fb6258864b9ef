"""Where the external programs the testbed runs are, or which package installs them."""

from __future__ import annotations

import os
import shutil
import sys

from tensorwire.testbed.errors import MissingTool

# program -> Debian package that provides it
PACKAGES = {
    "ip": "iproute2",
    "tc": "iproute2",
    "nft": "nftables",
    "iperf3": "iperf3",
    "stress-ng": "stress-ng",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "timeout": "coreutils",
}
_SBIN = os.pathsep.join(("/usr/sbin", "/sbin", "/usr/local/sbin"))  # often not on a user's PATH


def find_tool(name: str) -> str | None:
    """The path of program ``name``, also looking in the sbin directories; None if absent."""
    return shutil.which(name) or shutil.which(name, path=_SBIN)


def require_tool(name: str) -> str:
    """The path of program ``name``; :class:`MissingTool` with the apt-get command if absent."""
    found = find_tool(name)
    if found is None:
        raise MissingTool(name, PACKAGES.get(name, name))
    return found


def helper_command(module: str) -> list[str]:
    """The argv that runs ``module.main()`` in a new Python process, skipping
    ``tensorwire/__init__`` (numpy and the codecs, over a second): the testbed's helper
    processes (capability probe, user-namespace agent) need only ``tensorwire.testbed``."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import importlib, sys, types; tw = types.ModuleType('tensorwire'); "
        f"tw.__path__ = [{package!r}]; sys.modules['tensorwire'] = tw; "
        f"importlib.import_module({module!r}).main()"
    )
    return [sys.executable, "-c", code]
