"""The transport registry is the one list of transports: every entry is complete, and a
transport registered at runtime is served, connected and listed wherever protocols are
listed (bench fl, bench transfer, the CLI) without any other edit."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import tensorwire
from tensorwire.errors import UnknownScheme
from tensorwire.transports import KNOWN_TRANSPORTS, register_transport, unregister_transport
from tensorwire.transports.base import Channel, Hub
from tensorwire.transports.brokers.readiness import answers
from tensorwire.transports.local import local_hub_url
from tensorwire.transports.registry import (
    TransportEntry,
    bench_protocols,
    brokers,
    get_broker,
    get_transport,
    transports,
)
from tensorwire.transports.tcp import TcpChannel, TcpHub, TcpHubOptions

T = 20.0
SCHEMES_DIR = Path(__file__).with_name("schemes")
SRC = Path(tensorwire.__file__).parent


def _scheme_modules() -> dict[str, ModuleType]:
    modules = {}
    for path in sorted(SCHEMES_DIR.glob("[!_]*.py")):
        spec = importlib.util.spec_from_file_location(f"tw_registry_scheme_{path.stem}", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[module.SCHEME] = module
    return modules


ENTRIES = transports()  # the built-in ones, as imported


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.scheme for e in ENTRIES])
def test_every_entry_is_complete_and_its_classes_import(entry: TransportEntry) -> None:
    try:
        hub, channel = entry.load("hub"), entry.load("channel")
    except tensorwire.MissingDependency as exc:
        assert entry.extra and f"tensorwire[{entry.extra}]" in str(exc)
        pytest.skip(str(exc))
    assert issubclass(hub, Hub) and issubclass(channel, Channel)
    assert hub.protocol == channel.protocol == entry.name
    assert get_transport(entry.name) is get_transport(entry.scheme) is entry
    assert entry.label == f"tensorwire-{entry.name}"
    assert entry.url_here("t1").startswith(f"{entry.scheme}://")
    if entry.baseline is not None:
        assert importlib.util.find_spec(f"tensorwire.bench.baselines.{entry.baseline}")
    if entry.broker is not None:
        kind = get_broker(entry.broker)
        assert get_broker(entry.scheme) is get_broker(entry.name) is kind
        for what in ("server", "ensure", "answers", "find"):
            assert callable(kind.load(what))


def test_every_entry_has_a_conformance_scheme_file_and_every_file_an_entry() -> None:
    modules = _scheme_modules()
    assert sorted(modules) == sorted(e.scheme for e in ENTRIES)
    for scheme, module in modules.items():
        assert callable(module.hub_url), scheme
        assert callable(module.inject_garbage), scheme


def test_names_schemes_and_brokers_are_unique() -> None:
    names = [p for e in ENTRIES for p in e.protocols]
    assert len(names) == len(set(names))
    assert {b.name for b in brokers()} >= {e.broker for e in ENTRIES if e.broker}
    with pytest.raises(ValueError, match="already names zmq\\+tcp"):
        register_transport("zmq+ipc", "x.Hub", "x.Channel")
    with pytest.raises(ValueError, match="unknown broker"):
        register_transport("nats", "x.Hub", "x.Channel", broker="nats-server")
    assert "zmq+ipc" not in KNOWN_TRANSPORTS and "nats" not in KNOWN_TRANSPORTS
    with pytest.raises(ValueError, match="kind must be"):
        answers("tcp", "127.0.0.1:1")


def test_the_old_dict_view_still_reads_and_registers() -> None:
    assert KNOWN_TRANSPORTS["zmq+tcp"] == {
        "hub": "tensorwire.transports.zmq.ZmqHub",
        "channel": "tensorwire.transports.zmq.ZmqChannel",
        "extra": "zmq",
    }
    assert list(KNOWN_TRANSPORTS)[:2] == ["tcp", "zmq+tcp"]
    KNOWN_TRANSPORTS["old+tcp"] = {"hub": f"{__name__}.ToyHub", "channel": f"{__name__}.Toy"}
    try:
        assert get_transport("old").hub == f"{__name__}.ToyHub"
    finally:
        del KNOWN_TRANSPORTS["old+tcp"]
    assert "old+tcp" not in KNOWN_TRANSPORTS


def test_no_other_module_lists_the_transports() -> None:
    """Outside the registry, the transports' own modules and their brokers' modules, no
    source file names a transport or broker. tcp and udp aside: they are also the IP protocols
    the testbed waits on and counts, and tcp is the default transport of bench, fl and CLI."""
    words = {w for e in ENTRIES for w in (e.scheme, *e.protocols)} | {b.name for b in brokers()}
    words -= {"tcp", "udp"}
    own = {"transports/registry.py"}
    for e in ENTRIES:
        for path in (e.hub, e.channel):
            module = path.rpartition(".")[0].removeprefix("tensorwire.").replace(".", "/")
            own |= {f"{module}.py", f"{module}/"}
    for b in brokers():
        for path in (b.server, b.ensure, b.answers, b.find):
            own.add(path.rpartition(".")[0].removeprefix("tensorwire.").replace(".", "/") + ".py")
    alternatives = "|".join(map(re.escape, sorted(words)))
    pattern = re.compile(rf"""["']({alternatives})["']""")
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in own or any(rel.startswith(d) for d in own if d.endswith("/")):
            continue
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if pattern.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "transport names outside the registry:\n" + "\n".join(found)


# --- a transport registered at runtime -------------------------------------------------------


class ToyHub(TcpHub):
    """tcp under another scheme: the smallest transport there is."""

    protocol = "toy"

    def __init__(self, url: str, options: TcpHubOptions) -> None:
        super().__init__(url.replace("toy+tcp://", "tcp://", 1), options)
        self.url = self.url.replace("tcp://", "toy+tcp://", 1)


class ToyChannel(TcpChannel):
    protocol = "toy"


@pytest.fixture
def toy() -> Iterator[TransportEntry]:
    entry = register_transport(
        "toy+tcp", f"{__name__}.ToyHub", f"{__name__}.ToyChannel", baseline="socket"
    )
    try:
        yield entry
    finally:
        unregister_transport("toy+tcp")
    assert "toy+tcp" not in KNOWN_TRANSPORTS and "toy" not in bench_protocols()


def test_a_registered_transport_is_served_and_connected(toy: TransportEntry) -> None:
    assert (toy.name, toy.label, toy.local_url) == (
        "toy",
        "tensorwire-toy",
        "toy+tcp://127.0.0.1:0",
    )
    with local_hub_url("toy") as url:
        assert url == "toy+tcp://127.0.0.1:0"
        with tensorwire.serve(url, codec=None) as hub, tensorwire.connect(hub.url) as ch:
            assert isinstance(hub, ToyHub) and isinstance(ch, ToyChannel)
            assert hub.url.startswith("toy+tcp://127.0.0.1:")
            hub.wait_for(1, timeout=T)
            hub.send(ch.client_id, {"x": np.arange(6.0).reshape(2, 3)}, meta={"r": 1})
            msg = ch.recv(timeout=T)
            assert msg.meta == {"r": 1} and msg["x"].tolist() == [[0, 1, 2], [3, 4, 5]]
            ch.send({"y": np.ones(3, np.float32)})
            cid, back = hub.recv(timeout=T)
            assert cid == ch.client_id and back["y"].sum() == 3


def test_a_registered_transport_is_listed_by_bench_transfer_and_the_cli(
    toy: TransportEntry,
) -> None:
    from tensorwire.bench.transfer import wrapped_libraries, wrapped_library
    from tensorwire.cli import options

    assert options.transport_names()[-1] == "toy"
    assert options.transports_option("all")[-1] == "toy"
    assert options.transports_option("tcp,toy+tcp") == ["tcp", "toy"]
    assert "toy" in options.protocols_help()
    assert wrapped_library("toy") == "socket"
    assert wrapped_libraries(["toy", "zmq", "tcp"]) == ["socket", "pyzmq"]


def test_a_registered_transport_is_a_bench_fl_protocol(toy: TransportEntry) -> None:
    pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")
    from tensorwire.bench.fl import endpoints, protocol_problem
    from tensorwire.bench.fl_matrix import (
        Experiment,
        Matrix,
        protocol_name,
        protocol_schemes,
        registered_protocols,
    )
    from tensorwire.testbed import LoopbackTestbed

    assert registered_protocols()[-1] == "toy"
    assert protocol_schemes()["toy"] == "toy+tcp"
    assert protocol_name("toy+tcp") == "toy" and protocol_name("zmq+tcp") == "zmq"
    assert Matrix.quick().protocols[-1] == "toy"
    assert protocol_problem("toy") is None
    exp = Experiment("toy")
    with LoopbackTestbed(devices=1) as testbed, endpoints(testbed, exp) as ends:
        assert re.fullmatch(r"toy\+tcp://127\.0\.0\.1:\d+", ends.server_url)
        assert ends.device_url == ends.server_url and ends.broker is None


def test_unregistered_transports_are_unknown() -> None:
    with pytest.raises(UnknownScheme, match="known schemes: tcp://"):
        tensorwire.serve("toy+tcp://127.0.0.1:0")
    with pytest.raises(UnknownScheme, match="no transport named 'toy'"):
        get_transport("toy")
    with pytest.raises(UnknownScheme):
        unregister_transport("toy+tcp")
