"""The hooks a scheme module in ``tests/transports/schemes/`` declares: the interface between
the shared suites (conformance, faults, security, fan-out, streams) and one transport.

A module must define every name in :data:`REQUIRED`; it may define any in :data:`OPTIONAL`,
and the suites reach those only through :func:`optional`, so a suite asking for a hook nobody
declared fails loudly instead of skipping silently. :func:`check` runs on every module when
the suite is collected: a module that lacks a required hook, or whose hook takes the wrong
number of arguments, is an error at collection, not a skipped test.
"""

from __future__ import annotations

import inspect
import socket
from types import ModuleType
from typing import Any

REQUIRED: dict[str, int | None] = {
    "SCHEME": None,  # the URL scheme the module is for: "tcp"
    "hub_url": 1,  # (request) -> a URL to serve a fresh hub on
    "inject_garbage": 1,  # (hub_url): join as "intruder", then send what is no message
    "inject_forged": 2,  # (hub_url, client_ids): strangers' forged input on the medium
}
"""Name -> how many positional arguments it takes (None: a constant)."""

OPTIONAL: dict[str, int | None] = {
    "later_hub_url": 1,  # (request) -> a URL a channel may dial before a hub serves on it
    "IN_PROCESS": None,  # True: hub and channels share a process (peers are threads)
    "proxy_target": 1,  # (hub_url) -> (host, port) a recording proxy forwards to
    "proxied_url": 2,  # (hub_url, port) -> the URL reaching the hub through the proxy
    "secure_hub_url": 2,  # (request, enrolment) -> a URL for a secured hub
    "hub_security": 1,  # (enrolment) -> serve()'s credential keywords
    "client_security": 2,  # (enrolment, client_id) -> connect()'s credential keywords
    "replay_last": 2,  # (hub_url, enrolment): replay a captured message, as is and altered
    "private_broker": 1,  # (request) -> a broker of the test's own that it can restart
}


def check(module: ModuleType) -> ModuleType:
    """``module``, if it declares every required hook with the right arguments (and any
    optional hook it has likewise); else ``TypeError`` saying what is wrong."""
    where = f"tests/transports/schemes/{module.__name__.removeprefix('tw_scheme_')}.py"
    for name in REQUIRED:
        if not hasattr(module, name):
            raise TypeError(f"{where} lacks the required hook {name}")
    for name, arity in {**REQUIRED, **OPTIONAL}.items():
        hook = getattr(module, name, None)
        if hook is None or arity is None:
            continue
        params = inspect.signature(hook).parameters.values()
        positional = [p for p in params if p.default is p.empty and p.kind != p.VAR_KEYWORD]
        if len(positional) != arity:
            raise TypeError(f"{where}: {name} takes {len(positional)} arguments, not {arity}")
    return module


def optional(module: ModuleType, name: str) -> Any:
    """The optional hook ``name`` of ``module``, or None where the scheme has none."""
    if name not in OPTIONAL:
        raise KeyError(f"{name} is not a declared hook (tests/transports/scheme_hooks.py)")
    return getattr(module, name, None)


def held_port_url(request: Any, scheme: str) -> str:
    """``scheme://127.0.0.1:PORT`` for a port held, bound but not listening (SO_REUSEADDR),
    until the test ends: nobody else takes it, no hub serves it yet, and a hub can bind it
    (a port picked and released would race other processes for it)."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    request.addfinalizer(holder.close)
    return f"{scheme}://127.0.0.1:{holder.getsockname()[1]}"
