"""The exceptions and warnings the testbed raises; all derive from ``TensorwireError``."""

from __future__ import annotations

from tensorwire.errors import TensorwireError


class TestbedError(TensorwireError):
    """The testbed could not be built, shaped, measured or torn down."""

    __test__ = False  # not a pytest test class, despite the name


class NamespacesUnavailable(TestbedError, PermissionError):
    """This process may not create network namespaces (not root, no user namespaces)."""


class ShapingUnavailable(TestbedError):
    """The profile needs something this kernel (or this testbed kind) cannot do."""


class ProfileError(TestbedError, ValueError):
    """A link profile string or value that cannot be understood."""


class MissingTool(TestbedError, FileNotFoundError):
    """A program the testbed runs is not installed; the message gives the install command."""

    def __init__(self, tool: str, package: str) -> None:
        super().__init__(
            f"{tool!r} is not installed (or not on PATH): install it with "
            f"`apt-get install -y {package}` (Debian/Ubuntu)"
        )
        self.tool = tool
        self.package = package


class ShapingWarning(UserWarning):
    """Part of a profile could not be applied on this kernel (e.g. delay without netem)."""
