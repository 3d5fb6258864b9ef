"""Who may reach a ``ucx://`` hub: UCX's listener accepts on every address of the host (ucxx
takes only a port), so a hub served on a loopback address refuses connection requests that
come from anywhere else, as a socket bound to 127.0.0.1 would never see them.

The client's address comes from ``ucp_conn_request_query`` in the libucp that ucxx loaded
(ucxx passes the request on but does not expose the query). Where it cannot be read (another
UCX build), the hub cannot tell, accepts, and says so once in its log.
"""

from __future__ import annotations

import ctypes
import functools
import ipaddress
import logging
import socket
import struct
from pathlib import Path
from typing import Any

log = logging.getLogger("tensorwire.ucx")

_FIELD_CLIENT_ADDR = 1  # UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR
_ATTR_BYTES = 512
"""ucp_conn_request_attr_t: a u64 field mask, then a sockaddr_storage (128 bytes), then
fields newer UCX versions add; a larger buffer than any of them."""
_ADDR = 8  # offset of the sockaddr in the attributes


@functools.cache
def _query() -> Any:
    """libucp's ``ucp_conn_request_query``, or None where it cannot be found."""
    try:
        import libucx  # the wheel ucxx-cu12 loads its libucp from

        ucp = ctypes.CDLL(str(Path(libucx.__file__).parent / "lib" / "libucp.so"))
        query = ucp.ucp_conn_request_query
    except (ImportError, OSError, AttributeError) as exc:
        log.warning("ucx: cannot read connection requests' addresses (%s): accepting all", exc)
        return None
    query.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    query.restype = ctypes.c_int
    return query


def client_address(conn_request: int) -> str | None:
    """The IP address a UCX connection request came from; None if UCX cannot say."""
    query = _query()
    if query is None:
        return None
    attr = (ctypes.c_uint8 * _ATTR_BYTES)()
    struct.pack_into("<Q", attr, 0, _FIELD_CLIENT_ADDR)
    if query(ctypes.c_void_p(conn_request), ctypes.addressof(attr)) != 0:
        return None
    (family,) = struct.unpack_from("=H", attr, _ADDR)  # sa_family_t, host order
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, bytes(attr[_ADDR + 4 : _ADDR + 8]))
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, bytes(attr[_ADDR + 8 : _ADDR + 24]))
    return None


def loopback_only(host: str) -> bool:
    """True if a hub served on ``host`` is reachable only from this host's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refused_reach(host: str, conn_request: int) -> str | None:
    """Why a hub served on ``host`` refuses this connection request, or None to accept it."""
    if not loopback_only(host):
        return None
    address = client_address(conn_request)
    if address is None:
        return None
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None  # ::ffff:a.b.c.d
    if (mapped or ip).is_loopback:
        return None
    return f"a connection from {address} to a hub served on loopback ({host})"
