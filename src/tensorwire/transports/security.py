"""Credentials and what they prove: TLS settings, per-device keys, hello proofs, session keys,
and MACs for messages that cross a shared medium (a broker).

A device is enrolled by a secret bound to its client id (``tensorwire certs`` makes them) and/or
a TLS client certificate whose common name is its client id. Its hello carries a proof of the
secret (an HMAC over the hello's session id, a fresh nonce and the time; the secret itself never
travels); the hub answers with its own proof, and both derive a session key from the secret and
both nonces. On a broker every message then carries a MAC under that key and a sequence number,
so another broker user can neither inject nor replay one. ``docs/security.md`` specifies it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import ssl
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorwire.errors import AuthenticationError, TransportError

HELLO_SKEW_S = 300.0
"""Seconds a hello's clock may differ from the hub's (its proof covers the time)."""
MIN_SECRET_BYTES = 16
NONCE_BYTES = 16
MAC_BYTES = 16  # truncated HMAC-SHA256: 128-bit tags, as TLS and IPsec use
REPLAY_WINDOW = 4096  # sequence numbers behind the highest one that may still arrive once

_HELLO = b"tensorwire hello v2"
_WELCOME = b"tensorwire welcome v2"
_KEY = b"tensorwire session key v2"
_MAC = b"tensorwire message mac v2"


# --- TLS -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TLS:
    """TLS settings (PEM files) for a hub or a client; TLS 1.3 only.

    Hub: ``cert`` + ``key`` are its certificate; with ``ca`` it requires every client to
    present a certificate signed by that CA (mutual TLS), whose common name must be the client
    id it says hello with. Client: ``ca`` verifies the hub's certificate (its name must match
    the URL's host, or ``server_name``); ``cert`` + ``key`` are its own for mutual TLS.
    """

    cert: str | Path | None = None
    key: str | Path | None = None
    ca: str | Path | None = None
    server_name: str | None = None

    def server_context(self) -> ssl.SSLContext:
        if self.cert is None or self.key is None:
            raise TransportError("a hub's TLS needs cert= and key= (tensorwire certs makes them)")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_cert_chain(str(self.cert), str(self.key))
        if self.ca is not None:
            ctx.load_verify_locations(str(self.ca))
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=None if self.ca is None else str(self.ca))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        if self.cert is not None:
            if self.key is None:
                raise TransportError("a client certificate needs its key= too")
            ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx

    @property
    def mutual(self) -> bool:
        """Whether a hub with these settings requires client certificates."""
        return self.ca is not None and self.cert is not None


def peer_common_name(sock: Any) -> str | None:
    """The common name of the verified certificate the peer presented, if any."""
    cert = sock.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


# --- secrets ---------------------------------------------------------------------------------


def load_secret(value: bytes | str | Path) -> bytes:
    """A device secret from bytes, a hex string, or the path of a file holding the hex string."""
    if isinstance(value, bytes):
        secret = value
    else:
        text = str(value)
        path = Path(text)
        if isinstance(value, Path) or (len(text) < 512 and path.is_file()):
            text = path.read_text().strip()
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            raise AuthenticationError(
                "a device secret is hex digits (or a file of them, as tensorwire certs writes)"
            ) from None
    if len(secret) < MIN_SECRET_BYTES:
        raise AuthenticationError(f"a device secret needs at least {MIN_SECRET_BYTES} bytes")
    return secret


class Keys:
    """A hub's enrolled devices: client id -> secret.

    ``Keys({"dev1": "hex..."})``, or :meth:`load` a JSON file ``{"dev1": "hex", ...}`` or a
    directory of ``<client_id>.secret`` files (``tensorwire certs`` writes both).
    """

    def __init__(self, secrets: Mapping[str, bytes | str | Path]) -> None:
        self._secrets = {cid: load_secret(s) for cid, s in secrets.items()}
        if not self._secrets:
            raise AuthenticationError("Keys needs at least one enrolled client")

    @classmethod
    def load(cls, path: str | Path) -> Keys:
        p = Path(path)
        if p.is_dir():
            return cls({f.stem: f for f in sorted(p.glob("*.secret"))})
        data = json.loads(p.read_text())
        if not isinstance(data, dict):
            raise AuthenticationError(f"{p}: expected a JSON object of client id -> hex secret")
        return cls(data)

    def get(self, client_id: str) -> bytes | None:
        return self._secrets.get(client_id)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._secrets

    def __len__(self) -> int:
        return len(self._secrets)

    def ids(self) -> list[str]:
        return sorted(self._secrets)


# --- proofs and keys -------------------------------------------------------------------------


def _mac(key: bytes, *parts: bytes) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        h.update(struct.pack("<I", len(part)))
        h.update(part)
    return h.digest()


def hello_auth(secret: bytes, client_id: str, session: str) -> dict[str, Any]:
    """The ``auth`` field of a hello: a fresh nonce, the time and their proof."""
    nonce = os.urandom(NONCE_BYTES)
    ts = time.time()
    proof = _mac(secret, _HELLO, client_id.encode(), session.encode(), nonce, repr(ts).encode())
    return {"nonce": nonce, "ts": ts, "proof": proof}


def welcome_auth(secret: bytes, session: str, client_nonce: bytes) -> tuple[dict[str, Any], bytes]:
    """The ``auth`` field of a welcome (the hub's nonce and proof) and its session key."""
    nonce = os.urandom(NONCE_BYTES)
    proof = _mac(secret, _WELCOME, session.encode(), client_nonce, nonce)
    return {"nonce": nonce, "proof": proof}, session_key(secret, session, client_nonce, nonce)


def session_key(secret: bytes, session: str, client_nonce: bytes, hub_nonce: bytes) -> bytes:
    """32 bytes both sides derive (HKDF-SHA256 extract + one expand block)."""
    prk = hmac.new(client_nonce + hub_nonce, secret, hashlib.sha256).digest()
    return hmac.new(prk, _KEY + session.encode() + b"\x01", hashlib.sha256).digest()


def check_welcome(secret: bytes, session: str, client_nonce: bytes, auth: Any, where: str) -> bytes:
    """Verify the hub's proof in a welcome; return the session key."""
    if not isinstance(auth, dict):
        raise AuthenticationError(f"{where} did not prove it knows this client's secret")
    nonce, proof = auth.get("nonce"), auth.get("proof")
    if not isinstance(nonce, bytes) or not isinstance(proof, bytes) or len(nonce) != NONCE_BYTES:
        raise AuthenticationError(f"{where} sent a malformed proof")
    if not hmac.compare_digest(
        proof, _mac(secret, _WELCOME, session.encode(), client_nonce, nonce)
    ):
        raise AuthenticationError(f"{where} does not know this client's secret (wrong hub?)")
    return session_key(secret, session, client_nonce, nonce)


class KeyAuthenticator:
    """A hub's check of every hello against its enrolled :class:`Keys` (and, under mutual TLS,
    the certificate's name): the ``authenticate`` hook of a
    :class:`~tensorwire.transports.session.HubSession`.

    Refusals raise :class:`AuthenticationError` with the reason. A proof is accepted once:
    nonces seen in the last ``2 x skew_s`` seconds are remembered (at most ``max_nonces``).
    """

    def __init__(
        self,
        keys: Keys | None,
        *,
        skew_s: float = HELLO_SKEW_S,
        max_nonces: int = 100_000,
        require_tls_name: bool = False,
    ) -> None:
        self.keys = keys
        self.require_tls_name = require_tls_name  # mutual TLS is the only check: no name, no entry
        self.skew_s = skew_s
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._max_nonces = max_nonces
        self._lock = threading.Lock()

    def __call__(self, hello: Any, tls_name: str | None) -> tuple[dict[str, Any], bytes | None]:
        """Check a :class:`~tensorwire.transports.session.Hello`; return the welcome's ``auth``
        field and the session key."""
        client_id, session, auth = hello.client_id, hello.session, hello.meta.get("auth")
        if tls_name is None and self.require_tls_name:
            raise AuthenticationError(
                f"client {client_id!r} presented no named, verified certificate"
            )
        if tls_name is not None and tls_name != client_id:
            raise AuthenticationError(
                f"client certificate is for {tls_name!r}, the hello says {client_id!r}"
            )
        if self.keys is None:
            return {}, None
        secret = self.keys.get(client_id)
        if secret is None:
            raise AuthenticationError(f"client {client_id!r} is not enrolled")
        if not isinstance(auth, dict):
            raise AuthenticationError(f"client {client_id!r} sent no proof of its secret")
        nonce, ts, proof = auth.get("nonce"), auth.get("ts"), auth.get("proof")
        if (
            not isinstance(nonce, bytes)
            or len(nonce) != NONCE_BYTES
            or not isinstance(ts, float)
            or not isinstance(proof, bytes)
        ):
            raise AuthenticationError(f"client {client_id!r} sent a malformed proof")
        now = time.time()
        if abs(now - ts) > self.skew_s:
            raise AuthenticationError(
                f"client {client_id!r}'s clock is {ts - now:+.0f} s off the hub's "
                f"(at most {self.skew_s:.0f} s allowed): set both clocks right"
            )
        expected = _mac(
            secret, _HELLO, client_id.encode(), session.encode(), nonce, repr(ts).encode()
        )
        if not hmac.compare_digest(proof, expected):
            raise AuthenticationError(f"client {client_id!r} does not know its secret")
        with self._lock:
            self._forget(now)
            if nonce in self._seen:
                raise AuthenticationError(f"a replayed hello for {client_id!r}")
            self._seen[nonce] = now
        return welcome_auth(secret, session, nonce)

    def _forget(self, now: float) -> None:
        while self._seen and (
            len(self._seen) >= self._max_nonces
            or now - next(iter(self._seen.values())) > 2 * self.skew_s
        ):
            self._seen.popitem(last=False)


# --- MACs on a shared medium -------------------------------------------------------------------

_TRAILER = struct.Struct("<QH4s")  # sequence number, number of MACs, magic
_ENTRY = struct.Struct(f"<I{MAC_BYTES}s")  # recipient tag, MAC
_MAGIC = b"TWMA"


def recipient_tag(key: bytes) -> int:
    """A 32-bit label that tells a receiver which MAC in a broadcast is its own."""
    return int.from_bytes(_mac(key, b"tag")[:4], "little")


def seal(payload: Iterable[Any], seq: int, keys: list[bytes], sender: bytes) -> bytes:
    """The trailer that authenticates ``payload`` (buffers) as message number ``seq`` from
    ``sender``, once for each receiver's session key in ``keys``: append it to the payload."""
    digest = hashlib.sha256()
    for part in payload:
        digest.update(part)
    head = struct.pack("<Q", seq) + sender
    h = digest.digest()
    entries = b"".join(
        _ENTRY.pack(recipient_tag(k), _mac(k, _MAC, head, h)[:MAC_BYTES]) for k in keys
    )
    return entries + _TRAILER.pack(seq, len(keys), _MAGIC)


class Sealer:
    """Seals what one sender publishes for the receivers' session ``keys``: the trailer of
    :func:`seal`, under the sender's next number from ``counter``."""

    def __init__(self, keys: list[bytes], sender: bytes, counter: Iterator[int]) -> None:
        self.keys = keys
        self.sender = sender
        self.counter = counter

    @functools.cached_property
    def size(self) -> int:
        """Bytes the trailer adds to every payload."""
        return len(seal((), 0, self.keys, self.sender))

    def __call__(self, parts: Sequence[Any]) -> bytes:
        """The trailer for the payload made of ``parts`` (buffers)."""
        return seal(parts, next(self.counter), self.keys, self.sender)

    def reseal(self, body: bytes) -> bytes:
        """``body`` (sealed by this sealer) sealed again under a new number."""
        chunk = memoryview(body)[: len(body) - self.size]
        return b"".join([chunk, self([chunk])])


class ReplayWindow:
    """Sequence numbers of one sender seen so far: each is accepted once, and none more than
    :data:`REPLAY_WINDOW` behind the highest (chunks on two topics may arrive out of order)."""

    def __init__(self) -> None:
        self.highest = -1
        self._bits = 0  # bit i: highest - i was seen

    def check_and_add(self, seq: int) -> bool:
        if seq > self.highest:
            shift = seq - self.highest
            # a jump past the window forgets it all (and never builds an integer that large)
            bits = self._bits << shift if shift < REPLAY_WINDOW else 0
            self._bits = (bits | 1) & ((1 << REPLAY_WINDOW) - 1)
            self.highest = seq
            return True
        back = self.highest - seq
        if back >= REPLAY_WINDOW or self._bits >> back & 1:
            return False
        self._bits |= 1 << back
        return True


def unseal(data: memoryview, key: bytes, sender: bytes, window: ReplayWindow) -> memoryview:
    """Check the trailer of ``data`` under ``key`` (as a message from ``sender``) and return the
    payload; :class:`AuthenticationError` if it is missing, forged, for someone else or a
    replay."""
    if len(data) < _TRAILER.size:
        raise AuthenticationError("a message without a MAC on an authenticated session")
    seq, n, magic = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
    end = len(data) - _TRAILER.size - n * _ENTRY.size
    if magic != _MAGIC or n == 0 or end < 0:
        raise AuthenticationError("a message without a valid MAC trailer")
    tag = recipient_tag(key)
    payload = data[:end]
    for i in range(n):
        entry_tag, mac = _ENTRY.unpack_from(data, end + i * _ENTRY.size)
        if entry_tag != tag:
            continue
        h = hashlib.sha256(payload).digest()
        if not hmac.compare_digest(
            mac, _mac(key, _MAC, struct.pack("<Q", seq) + sender, h)[:MAC_BYTES]
        ):
            raise AuthenticationError("a message whose MAC does not verify (forged or altered)")
        if not window.check_and_add(seq):
            raise AuthenticationError(f"a replayed message (sequence number {seq})")
        return payload
    raise AuthenticationError("a message with no MAC for this session")


# --- URL options -------------------------------------------------------------------------------

URL_OPTIONS = {
    "tls": "1: use TLS (with the system's CAs unless ca= is given)",
    "ca": "PEM file of the CA that signs the other side's certificate",
    "cert": "PEM file of this side's certificate",
    "certkey": "PEM file of this side's certificate key",
    "servername": "the name the hub's certificate must carry (client; default: the URL's host)",
    "secret": "file of this client's enrolled secret (hex)",
    "keys": "the hub's enrolment: keys.json or a directory of <id>.secret files",
}
"""Security options every scheme's URL takes (``?ca=certs/ca.pem&secret=...``): the same as
the ``tls=``, ``key=`` (client) and ``auth=`` (hub) arguments of ``connect`` / ``serve``."""


def split_security_options(url: str, role: str) -> tuple[str, dict[str, Any]]:
    """Take the security options out of ``url``'s query; return the rest of the URL and the
    ``serve`` (role ``hub``) or ``connect`` (``channel``) keyword arguments they stand for."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in URL_OPTIONS}
    if not ours:
        return url, {}
    rest = urlencode([(k, v) for k, v in query if k not in URL_OPTIONS], safe="/%:")
    url = urlunsplit(parts._replace(query=rest))
    kwargs: dict[str, Any] = {}
    wants_tls = ours.get("tls", "0") not in ("0", "") or any(
        k in ours for k in ("ca", "cert", "certkey", "servername")
    )
    if wants_tls:
        kwargs["tls"] = TLS(
            cert=ours.get("cert"),
            key=ours.get("certkey"),
            ca=ours.get("ca"),
            server_name=ours.get("servername"),
        )
    if role == "hub" and "keys" in ours:
        kwargs["auth"] = ours["keys"]
    if role == "channel" and "secret" in ours:
        kwargs["key"] = Path(ours["secret"])
    wrong = {"hub": "secret", "channel": "keys"}[role]
    if wrong in ours:
        raise TransportError(f"{wrong}= is for the {'client' if role == 'hub' else 'hub'}")
    return url, kwargs


def credentials_from_dir(
    directory: str | os.PathLike[str], role: str, client_id: str | None = None
) -> dict[str, Any]:
    """The ``serve`` (role ``hub``) or ``connect`` (``channel``, for ``client_id``) keyword
    arguments for the files ``tensorwire certs`` wrote into ``directory``: mutual TLS with its
    CA, and the enrolled keys (hub) or the device's secret (client)."""
    d = Path(directory)
    if role == "hub":
        names = {"cert": "hub.pem", "key": "hub.key", "ca": "ca.pem", "keys": "keys.json"}
    elif client_id is not None:
        names = {
            "cert": f"{client_id}.pem",
            "key": f"{client_id}.key",
            "ca": "ca.pem",
            "secret": f"{client_id}.secret",
        }
    else:
        raise ValueError("a client's credentials need its client_id")
    missing = [n for n in names.values() if not (d / n).is_file()]
    if missing:
        command = f"tensorwire certs --out {d}" + (f" --clients {client_id}" if client_id else "")
        what = "does not exist" if not d.is_dir() else f"lacks {', '.join(missing)}"
        raise AuthenticationError(f"{d} {what}: make the files with `{command}`")
    tls = TLS(cert=d / names["cert"], key=d / names["key"], ca=d / names["ca"])
    if role == "hub":
        return {"tls": tls, "auth": Keys.load(d / names["keys"])}
    return {"tls": tls, "key": d / names["secret"]}
