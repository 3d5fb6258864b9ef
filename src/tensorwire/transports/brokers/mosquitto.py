"""Find a Mosquitto broker that answers, or run a private one for as long as it is needed.

A private broker gets its own port (a free one unless given), its own directory for config and
log, listens on 127.0.0.1 only (or the ``bind`` address) and lets anyone in, unless given
``users`` (a password file; anonymous clients refused). With ``tls=`` its one listener speaks
TLS (``mqtts://``) on the given certificate. It keeps nothing on disk unless asked to
(``persistence=True``: sessions, subscriptions and queued messages are saved in its directory
when it stops and restored when it starts). ``restart(down_s)`` stops it, waits and starts it
again on the same port and directory (the port held meanwhile: :class:`~.ports.HeldPorts`);
``stop()`` ends the process and removes the directory.
With a ``command_prefix`` (e.g. ``ip netns exec NS``) it runs behind it, in a testbed's server
namespace, and is probed from there. Nothing here needs paho: the probe speaks MQTT itself,
in clear or, on a TLS listener, over TLS.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import os
import pwd
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from tensorwire._lifeline import Reaper
from tensorwire.errors import MissingDependency, TransportError, TransportTimeout
from tensorwire.transports.brokers.mqtt_packets import connect_packet
from tensorwire.transports.brokers.ports import HeldPorts, free_port, start_on_free_ports
from tensorwire.transports.brokers.readiness import logged, wait_answering
from tensorwire.transports.brokers.sizing import MOSQUITTO, size_for, with_fd_limit
from tensorwire.transports.security import TLS
from tensorwire.transports.url import host_port, with_option

DEFAULT_PORT = 1883
# Mosquitto's own password hashing (mosquitto_passwd's default since 2.0): PBKDF2-HMAC-SHA512
# over a 12-byte salt, 101 iterations, written as $7$ITERATIONS$SALT$HASH in base64.
_PBKDF2_ITERATIONS = 101
_SALT_BYTES = 12
INSTALL_HINT = (
    "apt-get install mosquitto (Debian/Ubuntu), dnf install mosquitto, brew install mosquitto"
)
_SBIN = ("/usr/sbin", "/usr/local/sbin")  # where packages put it, often not on a user's PATH


def mosquitto_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether an MQTT broker at ``host:port`` answers a CONNECT with a CONNACK within
    ``timeout`` seconds (a refusal, e.g. for missing credentials, still counts as answering).

    A port that drops the connection at the CONNECT in clear is asked again over TLS (an
    ``mqtts`` listener), without checking its certificate: the probe sends no credential."""
    answer = _connack(host, port, timeout, tls=False)
    if answer is None:
        answer = _connack(host, port, timeout, tls=True)
    return bool(answer)


def _connack(host: str, port: int, timeout: float, *, tls: bool) -> bool | None:
    """True if a CONNECT gets a CONNACK, or over TLS the connection ends after the handshake
    with no answer (a listener that requires a client certificate ends it so); None if a
    connection in clear ends with no answer or a TLS alert, as a TLS listener does with MQTT
    in clear; False otherwise."""
    connect = connect_packet(f"tw-probe-{uuid.uuid4().hex[:8]}", keepalive_s=10)
    ended = True if tls else None  # what a connection that ends unanswered says
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            raw.settimeout(timeout)
            sock = _probe_context().wrap_socket(raw, server_hostname=host) if tls else raw
            sock.sendall(connect)
            connack = b""
            while len(connack) < 4:
                got = sock.recv(4 - len(connack))
                if not got:
                    return ended if not connack else False
                if not tls and not connack and got[:1] == b"\x15":  # a TLS alert record
                    return None
                connack += got
            if connack[:2] != b"\x20\x02":
                return False
            if connack[3] == 0:
                sock.sendall(b"\xe0\x00")  # DISCONNECT
            return True
    except (ssl.SSLEOFError, ConnectionResetError):
        return ended
    except ssl.SSLError as exc:
        return "CERTIFICATE_REQUIRED" in str(exc.reason)
    except OSError:
        return False


@functools.cache
def _probe_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # whether it answers, not who it is: nothing secret is sent
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def find_mosquitto(binary: str = "mosquitto") -> str:
    """The path of the ``mosquitto`` executable; ``MissingDependency`` saying how to install it."""
    found = shutil.which(binary) or shutil.which(binary, path=os.pathsep.join(_SBIN))
    if found is None:
        raise MissingDependency(
            f"the Mosquitto broker ({binary!r}) is not installed: {INSTALL_HINT}"
        )
    return found


def find_mosquitto_passwd() -> str | None:
    """The path of ``mosquitto_passwd``, or None if it is not installed."""
    return shutil.which("mosquitto_passwd") or shutil.which(
        "mosquitto_passwd", path=os.pathsep.join(_SBIN)
    )


QUEUED_PER_DEVICE = 128  # chunks one device may have on their way: 8 MiB in 64 KiB chunks


def queued_messages(devices: int) -> int:
    """The ``max_queued_messages`` of a private broker for ``devices``: Mosquitto's own 1,000,
    plus :data:`QUEUED_PER_DEVICE` for each device, so that a hub whose devices all send at
    once loses none of it to a queue that is full while it reads."""
    return 1000 + QUEUED_PER_DEVICE * devices


@functools.cache
def _mosquitto_version(binary: str) -> tuple[int, ...]:
    """The version ``binary -h`` prints (``mosquitto version 2.0.11``); () if it says none."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        out = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=10).stdout
        found = re.search(r"mosquitto version (\d+)\.(\d+)", out)
        if found:
            return tuple(int(n) for n in found.groups())
    return ()


def hash_password(password: str, salt: bytes | None = None) -> str:
    """A password as Mosquitto's password file holds it (what ``mosquitto_passwd`` writes)."""
    salt = os.urandom(_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, _PBKDF2_ITERATIONS)
    b64 = base64.b64encode
    return f"$7${_PBKDF2_ITERATIONS}${b64(salt).decode()}${b64(digest).decode()}"


def write_password_file(path: Path, users: Mapping[str, str]) -> None:
    """Write ``user:hash`` lines for ``users`` (name -> password) into ``path``, mode 0600.

    ``mosquitto_passwd`` hashes them if it is installed (each password on its standard input,
    never on a command line that ``ps`` shows); else :func:`hash_password` does, the same way."""
    for name, password in users.items():
        if not name or ":" in name or "\n" in name or "\n" in password:
            raise TransportError(f"broker user {name!r}: no ':' in a name, no newline in either")
    tool = find_mosquitto_passwd()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        if tool is None:
            f.writelines(f"{name}:{hash_password(password)}\n" for name, password in users.items())
            return
    for name, password in users.items():
        done = subprocess.run(
            [tool, str(path), name],
            input=f"{password}\n{password}\n",  # asked for, then asked again
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            path.unlink()
            raise TransportError(f"mosquitto_passwd failed: {(done.stderr or done.stdout).strip()}")


class MosquittoBroker:
    """A private Mosquitto on ``127.0.0.1:port``; use as a context manager (or start/stop).

    ``settings`` are extra ``mosquitto.conf`` lines, e.g. ``{"max_packet_size": "65536"}``.
    ``bind`` is the address it listens on (and its URL names); ``command_prefix`` an argv
    prefix it is started behind, e.g. ``["ip", "netns", "exec", "NS"]``. ``persistence``
    keeps the broker's state in its directory across :meth:`restart`.

    ``tls``: its listener speaks TLS (1.3, or 1.2 on a Mosquitto older than 1.6) with
    ``tls.cert`` / ``tls.key``; ``tls.ca``, if given, verifies client certificates, which it
    requires only with ``require_certificate``. ``users`` (name -> password) go into a password
    file and anonymous clients are refused. :meth:`url` names the scheme and, if asked, a user.

    ``devices``: it gets file descriptors for that many (one connection each), or ``fds`` if
    given, and lets in :attr:`limits` ``.connections`` (``max_connections``): a client past
    them is turned away and the broker keeps running.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        port: int = 0,
        *,
        settings: Mapping[str, str] | None = None,
        binary: str = "mosquitto",
        startup_timeout: float = 10.0,
        bind: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
        persistence: bool = False,
        tls: TLS | None = None,
        users: Mapping[str, str] | None = None,
        require_certificate: bool = False,
        devices: int | None = None,
        fds: int | None = None,
    ) -> None:
        if tls is not None and (tls.cert is None or tls.key is None):
            raise TransportError(
                "a broker's TLS needs cert= and key= (tensorwire certs makes them)"
            )
        if require_certificate and (tls is None or tls.ca is None):
            raise TransportError("require_certificate needs tls= with a ca= to check them by")
        self.limits = size_for(devices, fds, MOSQUITTO)
        self.port = port
        self.persistence = persistence
        self.tls = tls
        self.users = dict(users or {})
        self.require_certificate = require_certificate
        self.host = bind
        self.command_prefix = list(command_prefix)
        self.settings = dict(settings or {})
        self.binary = binary
        self.startup_timeout = startup_timeout
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: Reaper | None = None  # ends the broker if this process is killed
        self._held = HeldPorts()  # its listener's port, kept while it is down for a restart

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def connection_limit(self) -> int:
        """The most clients its listener lets in: :attr:`limits` ``.connections``, or the
        ``max_connections`` its ``settings`` give."""
        given = self.settings.get("max_connections")
        return int(given) if given is not None and given.isdigit() else self.limits.connections

    def url(self, prefix: str = "", user: str | None = None) -> str:
        """``mqtt://127.0.0.1:PORT/prefix?connection_max=N`` for this broker (``mqtts://``
        with TLS; N its connection limit, so that a hub warns before its devices fill it and a
        device past it gets ``BrokerFull``); with ``user``, one of :attr:`users`, the URL
        carries that user's name and password."""
        scheme = "mqtts" if self.tls is not None else "mqtt"
        who = ""
        if user is not None:
            if user not in self.users:
                raise TransportError(f"{user!r} is not a user of this broker: {sorted(self.users)}")
            who = f"{quote(user, safe='')}:{quote(self.users[user], safe='')}@"
        url = f"{scheme}://{who}{self.host}:{self.port}/{prefix}"
        return with_option(url, "connection_max", str(self.connection_limit))

    def _tls_lines(self, binary: str) -> dict[str, str]:
        if self.tls is None:
            return {}
        assert self.tls.cert is not None and self.tls.key is not None  # checked in __init__
        lines = {
            "certfile": str(Path(self.tls.cert).resolve()),
            "keyfile": str(Path(self.tls.key).resolve()),
            # the minimum version from 2.0 on, the only one in 1.6, unknown before
            "tls_version": "tlsv1.3" if _mosquitto_version(binary) >= (1, 6) else "tlsv1.2",
            "require_certificate": "true" if self.require_certificate else "false",
        }
        if self.tls.ca is not None:
            lines["cafile"] = str(Path(self.tls.ca).resolve())
        return lines

    def _config(self, binary: str) -> str:
        assert self.dir is not None
        lines = {
            "listener": f"{self.port} {self.host}",
            "max_connections": str(self.limits.connections),  # this listener's
            # Mosquitto drops QoS 1 messages queued for a subscriber past 1,000 by default,
            # whatever its MQTT 5 Receive Maximum says: a hub of 2,000 devices that read their
            # replies more slowly than they came lost 290 of them. Room for a window of small
            # chunks from every device at once (the messages' bytes are the broker's one
            # stored copy each, not per queue).
            "max_queued_messages": str(queued_messages(self.limits.connections)),
            **self._tls_lines(binary),
            "allow_anonymous": "false" if self.users else "true",
            **({"password_file": str(self.dir / "passwd")} if self.users else {}),
            "persistence": "true" if self.persistence else "false",
            # saved on a clean stop (SIGTERM), restored on start; mosquitto wants the final /
            **({"persistence_location": f"{self.dir}/"} if self.persistence else {}),
            "log_dest": "stderr",
            "set_tcp_nodelay": "true",  # else a small message can wait ~40 ms on a delayed ACK
            # run as root, Mosquitto would switch to user "mosquitto", who cannot read our dir
            "user": pwd.getpwuid(os.getuid()).pw_name,
            **self.settings,
        }
        return "".join(f"{k} {v}\n" for k, v in lines.items())

    def _hold_port(self) -> None:
        """Hold the listener's port, on each address its host names, until :meth:`stop`:
        while the broker is down for a restart no connection takes it as its local end (one
        did, and the restart failed: "Error: Address already in use"). Mosquitto sets
        ``SO_REUSEADDR`` on its listener before binding it (2.0.11, seen with strace), so it
        binds beside the held socket, which never listens; a held socket without it would
        keep Mosquitto out. Not behind a prefix: its port is in another network namespace."""
        if self.command_prefix:
            return
        try:  # the addresses Mosquitto binds for the listener's host
            found = socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError:
            found = []  # unresolvable: Mosquitto's start says so
        self._held.hold((str(address[0]), self.port) for *_, address in found)

    def start(self) -> MosquittoBroker:
        """Start the broker and wait until it answers; raise with its log if it does not.
        Without a port given, a free one (another if that was taken before the broker bound
        it: :mod:`~tensorwire.transports.brokers.ports`)."""
        if self.port != 0:
            return self._start_once()

        def forget() -> None:
            self.port = 0

        return start_on_free_ports(self._start_once, forget, "mosquitto")

    def _start_once(self) -> MosquittoBroker:
        binary = find_mosquitto(self.binary)
        if self.port == 0:
            # Behind a prefix the broker's namespace is elsewhere: any port free here will do.
            self.port = free_port("127.0.0.1" if self.command_prefix else self.host)
        self._hold_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tensorwire-mosquitto-"))
        try:
            if self.users:
                write_password_file(self.dir / "passwd", self.users)
            (self.dir / "mosquitto.conf").write_text(self._config(binary))
        except BaseException:
            self.stop()
            raise
        self._run(binary)
        return self

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the broker (cleanly: a persistent one saves its state), stay down ``down_s``
        seconds, then start it again on the same port, config and directory."""
        if self._proc is None or self.dir is None:
            raise TransportError("restart() needs a started broker")
        self._end_process()
        time.sleep(down_s)
        self._run(find_mosquitto(self.binary))

    def _run(self, binary: str) -> None:
        """Start the process on the config in :attr:`dir`; wait until it answers, or until
        its log says it could not start its listener."""
        assert self.dir is not None
        argv = [binary, "-c", str(self.dir / "mosquitto.conf")]
        log_path = self.dir / "mosquitto.log"
        since = log_path.stat().st_size if log_path.exists() else 0  # past starts' lines
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*self.command_prefix, *with_fd_limit(argv, self.limits.fds)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
            )
        self._reaper = Reaper(self._proc, remove=self.dir)
        target = f"{self.host}:{self.port}"

        def failed() -> str:  # "Error: Address already in use", say: it will not answer
            return logged(log_path, since, b"Error: ")

        proc, prefix = self._proc, self.command_prefix
        if not wait_answering(proc, "mqtt", target, self.startup_timeout, prefix, failed):
            log_tail = log_path.read_text(errors="replace")[-2000:]
            running, error_line = proc.poll() is None, failed()
            timed_out = running and not error_line
            self.stop()
            error = TransportTimeout if timed_out else TransportError
            raise error(
                f"mosquitto on {target} did not start"
                f"{' within ' + str(self.startup_timeout) + ' s' if timed_out else ''}"
                f"{': ' + error_line if error_line else ''}; its log:\n{log_tail}"
            )

    def _end_process(self) -> None:
        """SIGTERM (a persistent broker then saves its state), SIGKILL if it lingers 5 s."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None

    def stop(self) -> None:
        """End the broker process, let its port go and remove its directory."""
        self._end_process()
        self._held.release()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def ensure_mosquitto(url: str, **broker_options: Any) -> Iterator[str]:
    """Yield ``url`` if a broker answers there, else the URL of a private :class:`MosquittoBroker`
    (``url`` with host and port replaced, and its ``connection_max=``) that is stopped when
    the block ends."""
    host, port = host_port(url, default_port=DEFAULT_PORT)
    if mosquitto_answers(host, port):
        yield url
        return
    with MosquittoBroker(**broker_options) as broker:
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        private = urlunsplit(parts._replace(netloc=f"{netloc}{broker.host}:{broker.port}"))
        yield with_option(private, "connection_max", str(broker.connection_limit))
