"""Find a Mosquitto broker that answers, or run a private one for as long as it is needed.

A private broker gets its own port (a free one unless given), its own directory for config and
log, listens on 127.0.0.1 only (or the ``bind`` address) and lets anyone in. It keeps nothing
on disk unless asked to (``persistence=True``: sessions, subscriptions and queued messages are
saved in its directory when it stops and restored when it starts). ``restart(down_s)`` stops
it, waits and starts it again on the same port and directory; ``stop()`` ends the process and
removes the directory. With a ``command_prefix`` (e.g. ``ip netns exec NS``) it runs behind
it, in a testbed's server namespace, and is probed from there. Nothing here needs paho: the
probe speaks MQTT itself.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tensorwire.errors import MissingDependency, TransportError, TransportTimeout
from tensorwire.transports.brokers.readiness import wait_answering
from tensorwire.transports.url import host_port

DEFAULT_PORT = 1883
INSTALL_HINT = (
    "apt-get install mosquitto (Debian/Ubuntu), dnf install mosquitto, brew install mosquitto"
)
_SBIN = ("/usr/sbin", "/usr/local/sbin")  # where packages put it, often not on a user's PATH


def mosquitto_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether an MQTT broker at ``host:port`` answers a CONNECT with a CONNACK within
    ``timeout`` seconds (a refusal, e.g. for missing credentials, still counts as answering)."""
    client_id = f"tw-probe-{uuid.uuid4().hex[:8]}".encode()
    # MQTT 3.1.1 CONNECT: protocol "MQTT" level 4, clean session, keepalive 10 s
    body = b"\x00\x04MQTT\x04\x02\x00\x0a" + len(client_id).to_bytes(2, "big") + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(bytes([0x10, len(body)]) + body)
            connack = b""
            while len(connack) < 4:
                got = sock.recv(4 - len(connack))
                if not got:
                    return False
                connack += got
            if connack[:2] != b"\x20\x02":
                return False
            if connack[3] == 0:
                sock.sendall(b"\xe0\x00")  # DISCONNECT
            return True
    except OSError:
        return False


def find_mosquitto(binary: str = "mosquitto") -> str:
    """The path of the ``mosquitto`` executable; ``MissingDependency`` saying how to install it."""
    found = shutil.which(binary) or shutil.which(binary, path=os.pathsep.join(_SBIN))
    if found is None:
        raise MissingDependency(
            f"the Mosquitto broker ({binary!r}) is not installed: {INSTALL_HINT}"
        )
    return found


def _free_port(host: str) -> int:
    with socket.create_server((host, 0)) as probe:
        return probe.getsockname()[1]


class MosquittoBroker:
    """A private Mosquitto on ``127.0.0.1:port``; use as a context manager (or start/stop).

    ``settings`` are extra ``mosquitto.conf`` lines, e.g. ``{"max_packet_size": "65536"}``.
    ``bind`` is the address it listens on (and its URL names); ``command_prefix`` an argv
    prefix it is started behind, e.g. ``["ip", "netns", "exec", "NS"]``. ``persistence``
    keeps the broker's state in its directory across :meth:`restart`.
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
    ) -> None:
        self.port = port
        self.persistence = persistence
        self.host = bind
        self.command_prefix = list(command_prefix)
        self.settings = dict(settings or {})
        self.binary = binary
        self.startup_timeout = startup_timeout
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def url(self, prefix: str = "") -> str:
        """``mqtt://127.0.0.1:PORT/prefix`` for this broker."""
        return f"mqtt://{self.host}:{self.port}/{prefix}"

    def _config(self) -> str:
        assert self.dir is not None
        lines = {
            "listener": f"{self.port} {self.host}",
            "allow_anonymous": "true",
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

    def start(self) -> MosquittoBroker:
        """Start the broker and wait until it answers; raise with its log if it does not."""
        binary = find_mosquitto(self.binary)
        if self.port == 0:
            # Behind a prefix the broker's namespace is elsewhere: any port free here will do.
            self.port = _free_port("127.0.0.1" if self.command_prefix else self.host)
        self.dir = Path(tempfile.mkdtemp(prefix="tensorwire-mosquitto-"))
        (self.dir / "mosquitto.conf").write_text(self._config())
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
        """Start the process on the config in :attr:`dir`; wait until it answers."""
        assert self.dir is not None
        with open(self.dir / "mosquitto.log", "ab") as log:
            self._proc = subprocess.Popen(
                [*self.command_prefix, binary, "-c", str(self.dir / "mosquitto.conf")],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
            )
        target = f"{self.host}:{self.port}"
        if not wait_answering(
            self._proc, "mqtt", target, self.startup_timeout, self.command_prefix
        ):
            log_tail = (self.dir / "mosquitto.log").read_text(errors="replace")[-2000:]
            running = self._proc.poll() is None
            self.stop()
            error = TransportTimeout if running else TransportError
            raise error(
                f"mosquitto on {target} did not start"
                f"{' within ' + str(self.startup_timeout) + ' s' if running else ''}; "
                f"its log:\n{log_tail}"
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

    def stop(self) -> None:
        """End the broker process and remove its directory."""
        self._end_process()
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
    (``url`` with host and port replaced) that is stopped when the block ends."""
    host, port = host_port(url, default_port=DEFAULT_PORT)
    if mosquitto_answers(host, port):
        yield url
        return
    with MosquittoBroker(**broker_options) as broker:
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        yield urlunsplit(parts._replace(netloc=f"{netloc}{broker.host}:{broker.port}"))
