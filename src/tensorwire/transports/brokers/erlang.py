"""What the Erlang/OTP installed here can do, for a private RabbitMQ node."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

# Erlang/OTP's ssl serves TLS 1.3 from OTP 23 on (22's was experimental); the node asks for
# the newest its OTP has, as tensorwire's clients speak TLS 1.3 only.
_TLS13_OTP = 23


@functools.cache
def _otp_release() -> int:
    """The major Erlang/OTP release installed (``releases/N`` under ``erl``'s root); 0 if
    unknown."""
    erl = shutil.which("erl", path=f"{os.environ.get('PATH', '')}:/usr/lib/erlang/bin")
    if erl is None:
        return 0
    releases = [
        int(d.name)
        for d in (Path(erl).resolve().parent.parent / "releases").glob("*")
        if d.name.isdigit()
    ]
    return max(releases, default=0)


def tls_version() -> str:
    """The TLS version a private node serves: ``tlsv1.3`` where its Erlang has it, else
    ``tlsv1.2``."""
    return "tlsv1.3" if _otp_release() >= _TLS13_OTP else "tlsv1.2"
