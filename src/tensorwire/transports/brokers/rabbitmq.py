"""Find a RabbitMQ broker that answers, or run a private node for as long as it is needed.

A private node is its own Erlang node (``tensorwire-PID-XXXX@localhost``, never the system's
``rabbit@...``) with its own AMQP and distribution ports (free ones), its own epmd on a free
port, and every file it writes in one temporary directory: database, logs, config, the
enabled-plugins list (empty) and the Erlang cookie (``HOME`` points there). It listens on
127.0.0.1 only and lets the URL's user in. ``stop()`` asks the node to stop (SIGTERM, as
``rabbitmqctl stop`` does), kills what is left of its process group, ends its epmd and removes the
directory; ``restart(down_s)`` stops the node and starts it again on the same port, node
name and directory, so its durable queues and persistent messages come back: its listener
and distribution ports stay held meanwhile (:class:`~.ports.HeldPorts`), and a start waits
until every listener answers. With a
``command_prefix`` (e.g. ``ip netns exec NS``) the node, its epmd and
``rabbitmqctl`` run behind it, in a testbed's server namespace, and it is probed from there;
``bind`` is the address its AMQP listener takes. With ``tls=`` that listener speaks TLS
(``amqps://``) on the given certificate; ``use_tls`` adds one to a running node or rotates its
files. pika is imported only to probe a broker.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from tensorwire._lifeline import Reaper
from tensorwire.errors import MissingDependency, TransportError, TransportTimeout
from tensorwire.transports.brokers.erlang import tls_version
from tensorwire.transports.brokers.ports import HeldPorts, free_port, start_on_free_ports
from tensorwire.transports.brokers.rabbitmq_probe import rabbitmq_answers
from tensorwire.transports.brokers.readiness import logged, wait_all_answering
from tensorwire.transports.brokers.sizing import RABBITMQ, size_for, with_fd_limit
from tensorwire.transports.security import TLS
from tensorwire.transports.url import redacted

DEFAULT_PORT = 5672
INSTALL_HINT = "apt-get install rabbitmq-server (Debian/Ubuntu), dnf install rabbitmq-server"
# Debian's /usr/sbin/rabbitmq-server is a wrapper that switches to user "rabbitmq" (and its
# cookie and home): the scripts it wraps, in /usr/lib/rabbitmq/bin, run as we are.
_SEARCH = ("/usr/lib/rabbitmq/bin", "/usr/lib/rabbitmq/sbin", "/usr/sbin", "/usr/local/sbin")
STOP_TIMEOUT = 30.0  # seconds for the node to stop after SIGTERM before it is killed
CTL_TIMEOUT = 60.0  # seconds for one rabbitmqctl command (it starts an Erlang VM of its own)


def find_rabbitmq(binary: str = "rabbitmq-server") -> Path:
    """The ``rabbitmq-server`` script to run; ``MissingDependency`` saying how to install it."""
    path = os.pathsep.join([*_SEARCH[:2], os.environ.get("PATH", ""), *_SEARCH[2:]])
    found = shutil.which(binary, path=path)
    if found is None:
        raise MissingDependency(
            f"the RabbitMQ broker ({binary!r}) is not installed: {INSTALL_HINT}"
        )
    return Path(found)


def _credentials(url: str) -> tuple[str, str, str]:
    """(user, password, vhost) of an ``amqp://`` URL, with AMQP's defaults."""
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return unquote(parts.username or "guest"), unquote(parts.password or "guest"), vhost


class RabbitMQBroker:
    """A private RabbitMQ node on ``127.0.0.1:port``; use as a context manager (or start/stop).

    ``user``/``password``/``vhost`` are created at first boot; ``settings`` are extra
    ``rabbitmq.conf`` lines, e.g. ``{"max_message_size": "33554432"}``. ``bind`` is the
    address the AMQP listener takes (and its URL names); ``command_prefix`` an argv prefix
    every program of the node is started behind, e.g. ``["ip", "netns", "exec", "NS"]``.
    Its handshake and send timeouts are sized for lossy links (see :meth:`_config`).

    ``tls``: the listener on ``port`` speaks TLS (:func:`tls_version`) with ``tls.cert`` /
    ``tls.key`` (copied into the node's directory). It asks clients for no certificate
    (``verify_none``): its users' passwords admit connections and the hub decides who joins,
    and ``tensorwire certs`` makes the hub's certificate a server's, which Erlang would refuse
    as a client's. ``tls.ca`` is what its readiness probe checks it against. ``plain_port``
    (0: a free one) keeps a plain AMQP listener as well. :meth:`url` names ``amqps://`` then,
    :meth:`plain_url` the plain listener.

    ``devices``: the node gets file descriptors for that many (one connection each), or
    ``fds`` if given; :attr:`limits` says how many connections it then takes
    (``connection_max``: the one past it is refused, and the node keeps running). Its hub
    URLs (with a prefix) carry ``connection_max=``: a hub on it warns before it is reached.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        port: int = 0,
        *,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        settings: Mapping[str, str] | None = None,
        binary: str = "rabbitmq-server",
        startup_timeout: float = 60.0,
        bind: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
        tls: TLS | None = None,
        plain_port: int | None = None,
        devices: int | None = None,
        fds: int | None = None,
    ) -> None:
        _check_tls(tls)
        self.limits = size_for(devices, fds, RABBITMQ)
        if plain_port is not None and tls is None:
            raise TransportError("plain_port= is a second listener beside a TLS one: give tls=")
        self.port = port
        self.tls = tls
        self.plain_port = plain_port
        self.host = bind
        self.command_prefix = list(command_prefix)
        self.user, self.password, self.vhost = user, password, vhost
        self.settings = dict(settings or {})
        self.binary = binary
        self.startup_timeout = startup_timeout
        self.node = f"tensorwire-{os.getpid()}-{uuid.uuid4().hex[:6]}@localhost"
        self.dir: Path | None = None
        self._env: dict[str, str] = {}
        self._ctl: Path | None = None
        self._server: Path | None = None
        self._lock = threading.Lock()  # restart() and stop() one at a time
        self._proc: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self._held = HeldPorts()  # its listener and distribution ports, kept while it is down
        self._dist_port = 0  # Erlang distribution's, picked at start
        # They end the node's process group and epmd if this process is killed:
        self._reapers: dict[str, Reaper] = {}

    @property
    def pid(self) -> int | None:
        """The node's process id (its process group too) while it runs."""
        return self._proc.pid if self._proc is not None else None

    def url(self, prefix: str | None = None) -> str:
        """``amqp://user:pass@127.0.0.1:PORT/vhost`` for this broker (``amqps://`` with TLS;
        ``?prefix=`` and ``connection_max=`` if a prefix is given)."""
        return self._url("amqps" if self.tls is not None else "amqp", self.port, prefix)

    def plain_url(self, prefix: str | None = None) -> str:
        """The ``amqp://`` URL of the plain listener: :attr:`port` without TLS, else
        :attr:`plain_port` (``TransportError`` if the node has none)."""
        if self.tls is None:
            return self._url("amqp", self.port, prefix)
        if self.plain_port is None:
            raise TransportError("this node listens with TLS only: it has no plain_port")
        return self._url("amqp", self.plain_port, prefix)

    def _url(self, scheme: str, port: int, prefix: str | None) -> str:
        url = (
            f"{scheme}://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
            f"@{self.host}:{port}/{quote(self.vhost, safe='')}"
        )
        if prefix is None:
            return url
        return f"{url}?prefix={quote(prefix, safe='')}&connection_max={self.limits.connections}"

    def _probe_urls(self) -> list[str]:
        """What the readiness probe connects to, in turn: the plain listener if there is one,
        then the TLS one, checked against ``tls.ca`` (the node's certificate is rarely a
        public one). Both: the node runs on without a TLS listener it could not start."""
        urls = [] if self.tls is not None and self.plain_port is None else [self.plain_url()]
        if self.tls is not None:
            ca = f"&ca={quote(str(Path(self.tls.ca).resolve()))}" if self.tls.ca else ""
            urls.append(f"{self.url()}?tls=1{ca}")
        return urls

    def _hold_ports(self) -> None:
        """Hold the listener and distribution ports until :meth:`stop`: a restart finds them
        free (no connection took one as its local end while the node was down). Not behind a
        prefix: its ports are in another network namespace."""
        if not self.command_prefix:
            ports = [(self.host, self.port), (self.host, self.plain_port)]
            self._held.hold([*ports, ("127.0.0.1", self._dist_port)])

    def _config(self) -> str:
        lines = {
            **self._listener_lines(),
            "default_user": self.user,
            "default_pass": self.password,
            "default_vhost": self.vhost,
            "log.file.level": "warning",
            # one past limits.connections is refused with a reason (the vhost's limit, in the
            # definitions); past the backstop the listener stops accepting (no reason given)
            "connection_max": str(self.limits.backstop),
            "definitions.import_backend": "local_filesystem",
            "definitions.local.path": str(self._definitions()),
            # Lossy links: TCP backoff stalls a connection for a minute or more (see the docstring
            # of tensorwire.transports.amqp). A handshake gets as long as the client gives it
            # (amqp.HANDSHAKE_TIMEOUT; RabbitMQ's is 10 s), a send to a client as long as the
            # broker's heartbeat check takes to find it dead (3 x amqp.HEARTBEAT): the listener's
            # 30 s (Ranch's default) closed devices' connections at 20 % loss,
            # {writer,send_failed,{error,timeout}}. Setting one tcp_listen_options key replaces
            # RabbitMQ's list, so its other defaults are repeated.
            "handshake_timeout": "60000",
            "tcp_listen_options.send_timeout": "540000",
            # thousands of devices connect at once: RabbitMQ's 128 overflowed, and a dropped SYN
            # is retried by TCP only after 1, 3, 7 s (the kernel caps it at net.core.somaxconn)
            "tcp_listen_options.backlog": "4096",
            "tcp_listen_options.nodelay": "true",
            "tcp_listen_options.linger.on": "true",
            "tcp_listen_options.linger.timeout": "0",
            "tcp_listen_options.exit_on_close": "false",
            # RabbitMQ lets "guest" in from loopback only; a node bound elsewhere lets it in.
            **({} if self.host.startswith("127.") else {"loopback_users": "none"}),
            **self.settings,
        }
        return "".join(f"{k} = {v}\n" for k, v in lines.items())

    def _definitions(self) -> Path:
        """The node's user, vhost and the vhost's connection limit, imported as it boots."""
        assert self.dir is not None
        perms = {"configure": ".*", "write": ".*", "read": ".*"}
        limits = {"max-connections": self.limits.connections}
        definitions = {
            "users": [{"name": self.user, "password": self.password, "tags": "administrator"}],
            "vhosts": [{"name": self.vhost}],
            "permissions": [{"user": self.user, "vhost": self.vhost, **perms}],
            "parameters": [
                dict(vhost=self.vhost, component="vhost-limits", name="limits", value=limits)
            ],
        }
        path = self.dir / "definitions.json"
        path.write_text(json.dumps(definitions))
        return path

    def _listener_lines(self) -> dict[str, str]:
        """The AMQP listeners: plain on :attr:`port`, or TLS there (and plain on
        :attr:`plain_port`, if set) with the certificate files in the node's directory."""
        if self.tls is None:
            return {"listeners.tcp.default": f"{self.host}:{self.port}"}
        assert self.dir is not None
        tls_dir = self.dir / "tls"
        lines = {
            "listeners.tcp": "none",
            "listeners.ssl.default": f"{self.host}:{self.port}",
            "ssl_options.certfile": str(tls_dir / "cert.pem"),
            "ssl_options.keyfile": str(tls_dir / "key.pem"),
            "ssl_options.versions.1": tls_version(),
            "ssl_options.verify": "verify_none",
            "ssl_options.fail_if_no_peer_cert": "false",
        }
        if self.plain_port is not None:
            del lines["listeners.tcp"]
            lines["listeners.tcp.default"] = f"{self.host}:{self.plain_port}"
        return lines

    def _copy_tls_files(self) -> None:
        """Copy the certificate and its key into the node's directory (where :meth:`_config`
        names them), so that rotating them is replacing these copies."""
        assert self.dir is not None and self.tls is not None
        assert self.tls.cert is not None and self.tls.key is not None
        tls_dir = self.dir / "tls"
        tls_dir.mkdir(mode=0o700, exist_ok=True)
        for name, source in (("cert.pem", self.tls.cert), ("key.pem", self.tls.key)):
            target = tls_dir / name
            shutil.copyfile(source, target)
            target.chmod(0o600)

    def _environment(self, epmd_port: int) -> dict[str, str]:
        assert self.dir is not None
        d = self.dir
        local = "127.0.0.1"  # epmd and Erlang distribution stay on the node's own loopback
        return {
            **os.environ,
            "HOME": str(d),  # the Erlang cookie lives in $HOME: a private one
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),  # not /etc's (its NODENAME)
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "node.pid"),
            "ERL_EPMD_PORT": str(epmd_port),
            "ERL_EPMD_ADDRESS": local,
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self) -> RabbitMQBroker:
        """Start the node and wait until it accepts AMQP; raise with its log if it does not.
        Ports not given are free ones (others if one was taken before the node bound it:
        :mod:`~tensorwire.transports.brokers.ports`)."""
        given = (self.port, self.plain_port)

        def forget() -> None:
            self.port, self.plain_port = given

        return start_on_free_ports(self._start_once, forget, f"RabbitMQ node {self.node}")

    def _start_once(self) -> RabbitMQBroker:
        server = find_rabbitmq(self.binary)
        self._server = server
        self._ctl = server.with_name("rabbitmqctl")
        epmd = shutil.which("epmd", path=f"{os.environ.get('PATH', '')}:/usr/lib/erlang/bin")
        if epmd is None:
            raise MissingDependency(f"Erlang's epmd is not installed: {INSTALL_HINT}")
        # Behind a prefix the node's namespace is elsewhere: any port free here will do.
        here = "127.0.0.1" if self.command_prefix else self.host
        if self.port == 0:
            self.port = free_port(here)
        if self.plain_port == 0:
            self.plain_port = free_port(here)
        epmd_port, self._dist_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        self._hold_ports()
        self.dir = Path(tempfile.mkdtemp(prefix="tensorwire-rabbitmq-"))
        (self.dir / "rabbitmq-env.conf").write_text("")
        (self.dir / "enabled_plugins").write_text("[].\n")
        if self.tls is not None:
            self._copy_tls_files()
        self._env = self._environment(epmd_port)
        with open(self.dir / "startup.log", "wb") as out:
            # Our own epmd in the foreground, so it is ours to end (a node would start a daemon).
            self._epmd = subprocess.Popen(
                [*self.command_prefix, epmd, "-port", str(epmd_port), "-address", "127.0.0.1"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env,
            )
        self._reapers["epmd"] = Reaper(self._epmd)
        self._launch()
        return self

    def _launch(self) -> None:
        """Run the node on the prepared directory and environment; wait until it answers."""
        assert self.dir is not None and self._server is not None
        (self.dir / "rabbitmq.conf").write_text(self._config())  # use_tls() may have changed it
        if self.command_prefix:  # not held (:meth:`_hold_ports`): a port free now
            self._dist_port = free_port("127.0.0.1")
        self._env["RABBITMQ_DIST_PORT"] = str(self._dist_port)
        log, node_log = self.dir / "startup.log", self.dir / "log" / f"{self.node}.log"
        since = node_log.stat().st_size if node_log.exists() else 0  # past restarts' lines
        with open(log, "ab") as out:
            self._proc = subprocess.Popen(
                [*self.command_prefix, *with_fd_limit([str(self._server)], self.limits.fds)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=self._env,
                start_new_session=True,  # its own process group: stop() can end all of it
            )
        self._reapers["node"] = Reaper(self._proc, group=True, remove=self.dir)
        proc = self._proc

        def unbound() -> str:  # a listener it could not start (it runs on without it)
            return logged(node_log, since, b"Failed to start Ranch listener")

        urls, prefix = self._probe_urls(), self.command_prefix
        if not wait_all_answering(proc, "amqp", urls, self.startup_timeout, prefix, unbound):
            running, failed = proc.poll() is None, unbound()
            log_tail = log.read_text(errors="replace")[-3000:]
            self._teardown()
            error = TransportTimeout if running and not failed else TransportError
            raise error(
                f"RabbitMQ node {self.node} on {self.host}:{self.port} did not start"
                f"{' within ' + str(self.startup_timeout) + ' s' if running and not failed else ''}"
                f"{': ' + failed if failed else ''}; its log:\n{log_tail}"
            )

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the node, stay down ``down_s`` seconds, then start it again on the same port,
        node name and data directory (durable queues and persistent messages survive)."""
        with self._lock:
            if self.dir is None:
                raise TransportError("the broker is not running: start() it first")
            self._halt()
            time.sleep(down_s)
            self._launch()

    def use_tls(self, tls: TLS) -> None:
        """Serve TLS with ``tls``'s files from now on. A node that has a TLS listener takes
        them in without a restart (RabbitMQ's certificate rotation: the copies it reads are
        replaced and its PEM cache cleared, so new connections get the new files); a node
        without one is restarted with one on a free port, its plain listener kept as
        :attr:`plain_port`."""
        _check_tls(tls)
        with self._lock:
            if self.dir is None:
                raise TransportError("the broker is not running: start() it first")
            old, self.tls = self.tls, tls
            self._copy_tls_files()
            if old is not None:
                self._ctl_eval("ssl:clear_pem_cache().")
                return
            self.plain_port = self.port
            self.port = free_port("127.0.0.1" if self.command_prefix else self.host)
            self._hold_ports()
            self._halt()
            self._launch()

    def _ctl_eval(self, expression: str) -> str:
        """Evaluate an Erlang expression on the node (``rabbitmqctl eval``); its output."""
        assert self._ctl is not None
        done = subprocess.run(
            [*self.command_prefix, str(self._ctl), "-n", self.node, "eval", expression],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=CTL_TIMEOUT,
        )
        if done.returncode != 0:
            raise TransportError(
                f"rabbitmqctl eval {expression!r} on {self.node} failed: "
                f"{(done.stderr or done.stdout).strip()}"
            )
        return done.stdout

    def _halt(self) -> None:
        """Stop the node and wait until it is gone, keeping its directory and epmd.

        SIGTERM to the foreground ``rabbitmq-server`` script makes the node stop as
        ``rabbitmqctl stop`` does (connections closed, queues synced), without the second or
        two that command's own Erlang VM takes to start; what is left is killed.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):  # killed just below
            proc.wait(timeout=STOP_TIMEOUT)
        # Its helpers (erl_child_setup, inet_gethost) share its group; they may outlive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if reaper := self._reapers.pop("node", None):
            reaper.stop()

    def stop(self) -> None:
        """Stop the node (SIGTERM, then kill), end its epmd, remove its directory."""
        with self._lock:
            self._teardown()

    def _teardown(self) -> None:
        self._halt()
        if self._epmd is not None:
            self._epmd.terminate()
            try:
                self._epmd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._epmd.kill()
                self._epmd.wait(timeout=5)
            self._epmd = None
        if reaper := self._reapers.pop("epmd", None):
            reaper.stop()
        self._held.release()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> RabbitMQBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _check_tls(tls: TLS | None) -> None:
    if tls is not None and (tls.cert is None or tls.key is None):
        raise TransportError("a broker's TLS needs cert= and key= (tensorwire certs makes them)")


@contextlib.contextmanager
def ensure_rabbitmq(url: str, **broker_options: object) -> Iterator[str]:
    """Yield ``url`` if a broker accepts it, else the URL of a private :class:`RabbitMQBroker`
    (``url`` with host and port replaced; its user, password and vhost are created) that is
    stopped when the block ends. A private broker for an
    ``amqps://`` URL needs certificates: give ``tls=`` (``tensorwire certs`` makes them)."""
    if rabbitmq_answers(url):
        yield url
        return
    if urlsplit(url).scheme == "amqps" and broker_options.get("tls") is None:
        raise TransportError(
            f"no RabbitMQ answers at {redacted(url)}, and a private one "
            "for amqps:// needs a certificate: ensure_rabbitmq(url, tls=TLS(cert=, key=, "
            "ca=)), or local_hub_url(..., secure=CERTS_DIR)"
        )
    user, password, vhost = _credentials(url)
    options = {"user": user, "password": password, "vhost": vhost, **broker_options}
    with RabbitMQBroker(**options) as broker:  # type: ignore[arg-type]
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        yield urlunsplit(parts._replace(netloc=f"{netloc}{broker.host}:{broker.port}"))
