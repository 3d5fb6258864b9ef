"""Making the files a secured deployment needs (``tensorwire certs``), with ``cryptography``.

Into one directory: a CA (``ca.pem``, ``ca.key``), the hub's certificate for the names and
addresses it is reached by (``hub.pem``, ``hub.key``), and per device a certificate whose
common name is its client id (``<id>.pem``, ``<id>.key``) and a 32-byte secret
(``<id>.secret``, hex), plus ``keys.json`` (every device's secret, what the hub loads with
``tensorwire.Keys.load``) and, for ``zmq+tcp://``, CURVE key pairs (``hub.curve`` and
``<id>.curve``: public key, then secret key, Z85, one per line) and the hub's public key alone
for the devices (``hub.curve.pub``), when pyzmq is installed. Private keys are written mode
0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tensorwire.transports.session import CLIENT_ID

VALID_DAYS = 825  # the most a TLS server certificate is trusted for by common clients


@dataclass
class Enrolment:
    """What :func:`make_certs` wrote: the paths, by role."""

    directory: Path
    ca: Path
    hub_cert: Path
    hub_key: Path
    keys: Path
    devices: dict[str, dict[str, Path]] = field(default_factory=dict)


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    hosts: Sequence[str] = (),
    usage: Sequence[x509.ObjectIdentifier] = (),
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if hosts:
        alt: list[x509.GeneralName] = []
        for host in hosts:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alt.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usage)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certs(
    directory: str | os.PathLike[str],
    *,
    hosts: Sequence[str],
    clients: Sequence[str],
    ca_name: str = "tensorwire CA",
) -> Enrolment:
    """Write a CA, a hub certificate for ``hosts`` and each client's certificate and secret
    into ``directory`` (made if missing); an existing CA there is reused, so devices can be
    added later."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for cid in clients:
        if not CLIENT_ID.match(cid) or cid in {"ca", "hub", "keys"}:
            raise ValueError(f"{cid!r} cannot be a client id (1-128 of A-Za-z0-9._:@+=-)")
    ca_pem, ca_key_path = out / "ca.pem", out / "ca.key"
    if ca_pem.exists() and ca_key_path.exists():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _certificate(ca_name, ca_key, None, ca_key, ca=True)
        _write(ca_key_path, _key_pem(ca_key), private=True)
        _write(ca_pem, ca_cert.public_bytes(serialization.Encoding.PEM))
    hub_key = ec.generate_private_key(ec.SECP256R1())
    hub_cert = _certificate(
        hosts[0] if hosts else "tensorwire-hub",
        hub_key,
        ca_cert.subject,
        ca_key,
        hosts=hosts,
        # client use too: a broker that checks client certificates then admits the hub
        usage=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    )
    enrolment = Enrolment(
        directory=out,
        ca=ca_pem,
        hub_key=_write(out / "hub.key", _key_pem(hub_key), private=True),
        hub_cert=_write(out / "hub.pem", hub_cert.public_bytes(serialization.Encoding.PEM)),
        keys=out / "keys.json",
    )
    keys = json.loads(enrolment.keys.read_text()) if enrolment.keys.exists() else {}
    for cid in clients:
        key = ec.generate_private_key(ec.SECP256R1())
        # server use too: a rank of a collective group presents it to the ranks that dial it
        # (it names no host, so no client can take it for a hub's)
        usage = (ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH)
        cert = _certificate(cid, key, ca_cert.subject, ca_key, usage=usage)
        secret = secrets.token_hex(32)
        keys[cid] = secret
        enrolment.devices[cid] = {
            "cert": _write(out / f"{cid}.pem", cert.public_bytes(serialization.Encoding.PEM)),
            "key": _write(out / f"{cid}.key", _key_pem(key), private=True),
            "secret": _write(out / f"{cid}.secret", secret.encode() + b"\n", private=True),
        }
    _write(enrolment.keys, json.dumps(keys, indent=1, sort_keys=True).encode(), private=True)
    _write_curve_keys(out, clients)
    return enrolment


def _write_curve_keys(out: Path, clients: Sequence[str]) -> None:
    """ZeroMQ CURVE key pairs (public and secret, Z85, one per line), if pyzmq is installed."""
    try:
        import zmq
    except ImportError:
        return
    for name in ("hub", *clients):
        path = out / f"{name}.curve"
        if name == "hub" and path.exists():
            continue  # clients already trust this hub's public key
        public, secret = zmq.curve_keypair()
        _write(path, public + b"\n" + secret + b"\n", private=True)
        if name == "hub":
            _write(out / "hub.curve.pub", public + b"\n")
