"""tensorwire.transports.brokers.rabbitmq: probing, a private node's whole life and restart,
its owner killed, missing binary."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from killed_owner import killed_owner, wait_until
from waiting import until

import tensorwire
from tensorwire.errors import MissingDependency
from tensorwire.transports.brokers import RabbitMQBroker, ensure_rabbitmq, rabbitmq_answers
from tensorwire.transports.brokers.rabbitmq import CTL_TIMEOUT, find_rabbitmq

pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")

SYSTEM = "amqp://guest:guest@127.0.0.1:5672/%2F"
T = 20.0


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def _processes_of_node(prefix: str) -> list[int]:
    """Ids of live processes started for a node whose name begins with ``prefix``."""
    marker = f"RABBITMQ_NODENAME={prefix}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # exited meanwhile
                continue
    return found


def _children() -> list[int]:
    """Ids of this process's child processes (live or not yet reaped)."""
    me = str(os.getpid())
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[1] == me:
                kids.append(int(entry.name))
    return kids


def test_answers_needs_a_broker_and_its_credentials():
    assert not rabbitmq_answers(f"amqp://guest:guest@127.0.0.1:{_closed_port()}/%2F", timeout=1)
    if not rabbitmq_answers(SYSTEM):
        pytest.skip(f"no RabbitMQ answers at {SYSTEM}")
    assert rabbitmq_answers(f"{SYSTEM}?prefix=ignored")
    assert not rabbitmq_answers("amqp://nobody:wrong@127.0.0.1:5672/%2F")


def test_a_missing_binary_says_how_to_install_it():
    with pytest.raises(MissingDependency, match="apt-get install rabbitmq-server"):
        find_rabbitmq("no-such-rabbitmq-server")
    with pytest.raises(MissingDependency, match="apt-get install rabbitmq-server"):
        RabbitMQBroker(binary="no-such-rabbitmq-server").start()


def test_ensure_uses_a_broker_that_answers():
    if not rabbitmq_answers(SYSTEM):
        pytest.skip(f"no RabbitMQ answers at {SYSTEM}")
    with ensure_rabbitmq(SYSTEM) as url:
        assert url == SYSTEM


def test_a_private_broker_serves_and_leaves_nothing_behind(tmp_path, monkeypatch):
    try:
        find_rabbitmq()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    system_up = rabbitmq_answers(SYSTEM)
    # its data directory in a temporary directory of this test's own (other workers' brokers
    # come and go in the shared one)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kids_before = set(_children())
    node = f"tensorwire-{os.getpid()}-"
    nodes_before = set(_processes_of_node(node))  # the session's private node may run already
    wanted = f"amqp://tw:secret@127.0.0.1:{_closed_port()}/exp"
    with ensure_rabbitmq(wanted) as url:
        assert url != wanted and url.startswith("amqp://tw:secret@127.0.0.1:")
        assert url.endswith("/exp")  # the URL's user and vhost were created
        assert set(_processes_of_node(node)) - nodes_before
        assert list(tmp_path.glob("tensorwire-rabbitmq-*"))  # its data directory
        hub = tensorwire.serve(f"{url}?prefix=t-{uuid.uuid4().hex[:6]}")
        with hub, tensorwire.connect(hub.url, client_id="p", timeout=T) as ch:
            hub.wait_for(1, timeout=T)
            hub.send("p", {"v": np.arange(5)})
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(5))
            ch.send({"v": np.arange(2)})
            assert hub.recv(timeout=T)[0] == "p"
    assert set(_processes_of_node(node)) <= nodes_before
    assert set(_children()) <= kids_before  # its shell, node and epmd are all gone
    assert list(tmp_path.iterdir()) == []
    assert rabbitmq_answers(SYSTEM) == system_up  # the system broker was not disturbed


def test_a_private_broker_waits_out_a_lossy_link_and_keeps_rabbitmqs_socket_defaults():
    try:
        find_rabbitmq()
    except MissingDependency as exc:
        pytest.skip(str(exc))

    def env(node: RabbitMQBroker, key: str) -> str:
        assert node._ctl is not None
        run = subprocess.run(
            [str(node._ctl), "-n", node.node, "eval", f"application:get_env(rabbit, {key})."],
            env=node._env,
            capture_output=True,
            text=True,
            timeout=CTL_TIMEOUT,  # rabbitmqctl boots an Erlang VM: 20 s was short under load
            check=True,
        )
        return "".join(run.stdout.split())

    with RabbitMQBroker() as node:
        assert env(node, "handshake_timeout") == "{ok,60000}"
        options = env(node, "tcp_listen_options")
        assert "{send_timeout,540000}" in options
        for default in ("{linger,{true,0}}", "{exit_on_close,false}", "{nodelay,true}"):
            assert default in options  # setting one key must not drop RabbitMQ's others


def test_a_restart_keeps_port_node_directory_and_persistent_messages(request):
    pika = pytest.importorskip("pika")
    spec = importlib.util.spec_from_file_location(
        "tw_scheme_amqp_for_brokers", Path(__file__).with_name("schemes") / "amqp.py"
    )
    assert spec and spec.loader
    scheme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scheme)
    node = scheme.private_broker(request).node  # the session's private node
    port, name, directory, pid = node.port, node.node, node.dir, node.pid
    queue = f"twtest-restart-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(node.plain_url()))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    ch.basic_publish("", queue, b"kept", pika.BasicProperties(delivery_mode=2))
    conn.close()
    t = time.monotonic()
    node.restart(1.0)
    assert time.monotonic() - t >= 1.0
    assert (node.port, node.node, node.dir) == (port, name, directory) and node.pid != pid
    conn = pika.BlockingConnection(pika.URLParameters(node.plain_url()))
    try:
        ch = conn.channel()
        _, _, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"kept"
        ch.queue_delete(queue)
    finally:
        conn.close()


def test_a_node_with_tls_speaks_tls_13_is_probed_by_its_ca_and_rotates_without_restart(
    request, tmp_path
):
    import ssl

    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.brokers.rabbitmq import tls_version
    from tensorwire.transports.certs import make_certs
    from tensorwire.transports.security import TLS

    spec = importlib.util.spec_from_file_location(
        "tw_scheme_amqp_for_brokers_tls", Path(__file__).with_name("schemes") / "amqp.py"
    )
    assert spec and spec.loader
    scheme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scheme)
    first = make_certs(tmp_path / "a", hosts=["127.0.0.1"], clients=[])
    second = make_certs(tmp_path / "b", hosts=["127.0.0.1"], clients=[])

    def settings(e) -> TLS:
        return TLS(cert=e.hub_cert, key=e.hub_key, ca=e.ca)

    node = scheme._node(request, settings(first))  # the session's node, with a TLS listener
    was = node.tls
    url = node.url()
    assert url.startswith("amqps://") and node.plain_url().startswith("amqp://")
    assert rabbitmq_answers(node.plain_url())
    assert rabbitmq_answers(f"{url}?ca={first.ca}")
    assert not rabbitmq_answers(f"{url}?ca={second.ca}")  # not the broker that CA names
    assert not rabbitmq_answers(
        f"{url}?ca={first.ca}".replace(str(node.port), str(node.plain_port))
    )
    host, port = "127.0.0.1", node.port
    with socket.create_connection((host, port), timeout=T) as raw:
        ctx = TLS(ca=first.ca).client_context()
        with ctx.wrap_socket(raw, server_hostname=host) as tls_sock:
            assert tls_sock.version() == ("TLSv1.3" if tls_version() == "tlsv1.3" else "TLSv1.2")
    pid = node.pid
    try:
        node.use_tls(settings(second))
        assert node.pid == pid  # rotated in, no restart
        assert rabbitmq_answers(f"{url}?ca={second.ca}")
        assert not rabbitmq_answers(f"{url}?ca={first.ca}")
    finally:
        node.use_tls(was)
    with pytest.raises(ssl.SSLError):  # a client of TLS 1.2 and older only is refused
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        old.load_verify_locations(str(was.ca))
        with socket.create_connection((host, port), timeout=T) as raw:
            old.wrap_socket(raw, server_hostname=host).close()


def test_ensure_cannot_start_an_amqps_broker_without_a_certificate():
    url = f"amqps://guest:hunter2@127.0.0.1:{_closed_port()}/%2F"
    with (
        pytest.raises(tensorwire.TransportError, match="certificate") as info,
        ensure_rabbitmq(url),
    ):
        pass
    assert "hunter2" not in str(info.value)


def test_a_private_node_ends_when_the_process_that_started_it_is_killed():
    """SIGKILL gives its owner no chance to stop the node: its reapers end the node's process
    group and its epmd, and remove its directory."""
    try:
        find_rabbitmq()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    code = (
        "from tensorwire.transports.brokers import RabbitMQBroker; import time\n"
        "b = RabbitMQBroker().start(); print(b.node, b.dir, flush=True); time.sleep(300)"
    )
    with killed_owner(code, T) as line:
        assert len(line) == 2, "the owner did not start its node"
        node, directory = line
        assert _processes_of_node(node) and Path(directory).is_dir()
    deadline = time.monotonic() + T
    wait_until(lambda: not _processes_of_node(node), deadline, step=0.1)
    left = _processes_of_node(node)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    assert not left, f"processes of the node outlived its killed owner by {T} s: {left}"
    wait_until(lambda: not Path(directory).exists(), deadline)  # removed right after it ended
    assert not Path(directory).exists(), "the killed owner's node directory stayed"


def _refused(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` (a connection to it is refused)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def test_a_restart_holds_the_nodes_ports_while_it_is_down_and_waits_for_both_listeners(request):
    """Down for a restart, the node keeps its ports: nothing else binds one (a connection
    that took the TLS port as its local end once left the node up on its plain listener
    alone, which the readiness probe took for up, and every later amqps:// test was refused;
    one that took a new distribution port failed the restart: dist_port_already_used), and
    it comes back answering on both listeners."""
    spec = importlib.util.spec_from_file_location(
        "tw_scheme_amqp_for_brokers_held", Path(__file__).with_name("schemes") / "amqp.py"
    )
    assert spec and spec.loader
    scheme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scheme)
    node = scheme.tls_private_broker(request).node  # the session's node, with a TLS listener
    ports = (node.port, node.plain_port, node._dist_port)  # and Erlang distribution's
    tls_url = f"{node.url()}?ca={node.tls.ca}"
    failed: list[BaseException] = []

    def restart() -> None:
        try:
            node.restart(3.0)
        except BaseException as exc:  # said below
            failed.append(exc)

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    try:
        assert until(lambda: all(map(_refused, ports)), timeout=60), "the node did not stop"
        for port in ports:  # down (3 s): nothing listens on them, and they are still its own
            with socket.socket() as other, pytest.raises(OSError, match="in use"):
                other.bind(("127.0.0.1", port))
    finally:
        thread.join(150)
    assert not thread.is_alive() and not failed, f"the restart failed: {failed}"
    assert rabbitmq_answers(node.plain_url()) and rabbitmq_answers(tls_url)


def test_a_tls_port_taken_before_the_node_bound_it_is_picked_again(tmp_path, monkeypatch):
    """RabbitMQ runs on without a TLS listener it could not bind (eaddrinuse, in its log): the
    start sees that, rather than taking the plain listener's answer for the node's, and picks
    the port again like any other taken one."""
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.brokers import ports, rabbitmq
    from tensorwire.transports.certs import make_certs
    from tensorwire.transports.security import TLS

    try:
        find_rabbitmq()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    certs = make_certs(tmp_path, hosts=["127.0.0.1"], clients=[])
    picks: list[int] = []
    with socket.create_server(("127.0.0.1", 0)) as holder:  # another program's listener
        taken = holder.getsockname()[1]

        def pick(host: str) -> int:  # the first pick (the TLS port) is taken meanwhile
            picks.append(taken if not picks else ports.free_port(host))
            return picks[-1]

        monkeypatch.setattr(rabbitmq, "free_port", pick)
        tls = TLS(cert=certs.hub_cert, key=certs.hub_key, ca=certs.ca)
        with RabbitMQBroker(tls=tls, plain_port=0) as node:
            assert picks[0] == taken and node.port not in (0, taken)
            assert rabbitmq_answers(f"{node.url()}?ca={certs.ca}")
