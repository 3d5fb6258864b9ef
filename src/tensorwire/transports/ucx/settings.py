"""Which UCX transports and devices a ``ucx://`` URL may use, and the UCX settings they become.

UCX would otherwise open connections on every network device it finds; a hub or channel here
uses only ``ucx_net_devices`` (default ``lo``: loopback) and the UCX transports of
``ucx_tls`` (default ``tcp,sm,self``: TCP for the connection and for peers on other hosts,
shared memory between processes of one host where UCX can use it, ``self`` within one
process). ``UCX_TLS=sm,self`` alone cannot connect: the listener needs a network transport.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tensorwire.errors import TransportError
from tensorwire.transports.url import query_options

DEFAULT_TLS = "tcp,sm,self"
DEFAULT_DEVICES = "lo"
KEEPALIVE = "1s"
"""UCX's keepalive between endpoints: a peer that dies without closing (shared memory has no
end-of-stream to see) fails its endpoint's requests within a few of these."""
URL_OPTIONS = ("ucx_tls", "ucx_net_devices")
_LIST = re.compile(r"^[A-Za-z0-9_:.,^-]{1,200}$")


@dataclass(frozen=True)
class UcxSettings:
    """The UCX configuration of one hub or channel (``UCX_TLS``, ``UCX_NET_DEVICES``)."""

    tls: str = DEFAULT_TLS
    net_devices: str = DEFAULT_DEVICES

    @classmethod
    def from_url(cls, url: str) -> UcxSettings:
        """The settings a ``ucx://`` URL's query names; ``TransportError`` for unknown or
        malformed options."""
        query = query_options(url, URL_OPTIONS)
        settings = cls(
            tls=query.get("ucx_tls", DEFAULT_TLS),
            net_devices=query.get("ucx_net_devices", DEFAULT_DEVICES),
        )
        for name, value in (("ucx_tls", settings.tls), ("ucx_net_devices", settings.net_devices)):
            if not _LIST.match(value):
                raise TransportError(
                    f"{url!r}: {name}={value!r} must be a comma-separated list of UCX names "
                    "(ucx_tls=tcp,sm,self; ucx_net_devices=lo)"
                )
        return settings

    def config(self) -> dict[str, str]:
        """The UCX context's configuration (UCX variable names without ``UCX_``)."""
        return {
            "TLS": self.tls,
            "NET_DEVICES": self.net_devices,
            "KEEPALIVE_INTERVAL": KEEPALIVE,
            "WARN_UNUSED_ENV_VARS": "n",
        }

    def query(self) -> str:
        """The URL query that gives these settings ('' for the defaults)."""
        parts = []
        if self.tls != DEFAULT_TLS:
            parts.append(f"ucx_tls={self.tls}")
        if self.net_devices != DEFAULT_DEVICES:
            parts.append(f"ucx_net_devices={self.net_devices}")
        return "?" + "&".join(parts) if parts else ""
