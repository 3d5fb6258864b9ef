"""An emulated network for benchmarks: a server and N devices on shaped links.

:class:`Testbed` puts each node in its own network namespace with a veth link per device,
shaped to a :class:`LinkProfile` (``3g``, ``4g``, ``wifi``, ``lan``, ``none`` or custom rate,
delay, jitter and loss); :func:`cpu_stress` and :func:`network_stress` load it for a bounded
time; :meth:`Testbed.counters` reads TCP retransmissions and link bytes. Where namespaces
cannot be made, :class:`LoopbackTestbed` runs the same code unshaped on 127.0.0.1 and says so.
"""

from tensorwire.testbed.capabilities import Capabilities, Capability, probe_capabilities
from tensorwire.testbed.counters import Counters, LinkCounters
from tensorwire.testbed.errors import (
    MissingTool,
    NamespacesUnavailable,
    ProfileError,
    ShapingUnavailable,
    ShapingWarning,
    TestbedError,
)
from tensorwire.testbed.loopback import LoopbackTestbed
from tensorwire.testbed.profile import PROFILES, LinkProfile, as_profile
from tensorwire.testbed.shaping import AppliedShaping
from tensorwire.testbed.stress import Stressor, cpu_stress, network_stress
from tensorwire.testbed.testbed import Testbed

__all__ = [
    "PROFILES",
    "AppliedShaping",
    "Capabilities",
    "Capability",
    "Counters",
    "LinkCounters",
    "LinkProfile",
    "LoopbackTestbed",
    "MissingTool",
    "NamespacesUnavailable",
    "ProfileError",
    "ShapingUnavailable",
    "ShapingWarning",
    "Stressor",
    "Testbed",
    "TestbedError",
    "as_profile",
    "cpu_stress",
    "network_stress",
    "probe_capabilities",
]
