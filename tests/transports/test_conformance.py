"""One conformance suite, run against every transport scheme (see conftest.SCHEMES)."""

from __future__ import annotations

import logging
import threading
import time

import ml_dtypes
import numpy as np
import pytest
import scheme_hooks
from waiting import until_inside

import tensorwire
from tensorwire.errors import GatherTimeout, PeerGone, TransportTimeout
from tensorwire.wire import WIRE_DTYPES

T = 20.0  # seconds: generous bound for anything that should take milliseconds


def _sample(dtype: np.dtype, shape=(3, 5)) -> np.ndarray:
    rng = np.random.default_rng(1)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _assert_same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()  # bit-exact, NaN payloads included


def test_every_dtype_both_directions(make_hub, connect):
    hub = make_hub()
    ch = connect(hub.url, client_id="dev1")
    hub.wait_for(1, timeout=T)
    tensors = {name: _sample(dt) for name, dt in WIRE_DTYPES.items()}
    hub.send("dev1", tensors, meta={"round": 1})
    msg = ch.recv(timeout=T)
    assert msg.meta == {"round": 1}
    for name, arr in tensors.items():
        _assert_same(msg[name], arr)
    ch.send(tensors, meta={"samples": 12})
    client, back = hub.recv(timeout=T)
    assert client == "dev1" and back.meta == {"samples": 12}
    for name, arr in tensors.items():
        _assert_same(back[name], arr)


def test_zero_d_empty_fortran_and_nested(make_hub, connect):
    hub = make_hub()
    ch = connect(hub.url, client_id="d")
    hub.wait_for(1, timeout=T)
    tensors = {
        "scalar": np.array(7, np.int64),
        "empty": np.zeros((0, 4), np.float32),
        "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "strided": np.arange(100, dtype=np.int16)[::7],
        "model": {"layer.weight": np.ones((2, 2), ml_dtypes.bfloat16)},
    }
    ch.send(tensors)
    _, msg = hub.recv(timeout=T)
    _assert_same(msg["scalar"], tensors["scalar"])
    _assert_same(msg["empty"], tensors["empty"])
    _assert_same(np.ascontiguousarray(msg["fortran"]), np.ascontiguousarray(tensors["fortran"]))
    assert msg["fortran"].flags.f_contiguous
    _assert_same(msg["strided"], np.ascontiguousarray(tensors["strided"]))
    _assert_same(msg["model"]["layer.weight"], tensors["model"]["layer.weight"])


def test_torch_state_dict_round_trip(make_hub, connect):
    torch = pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(2),
    )
    model(torch.zeros(1, 3, 8, 8))
    state = model.state_dict()
    hub = make_hub()
    ch = connect(hub.url, client_id="t")
    hub.wait_for(1, timeout=T)
    hub.broadcast({"weights": state}, meta={"round": 0})
    got = ch.recv(timeout=T).to_torch()["weights"]
    assert list(got) == list(state)
    for k, v in state.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v)
    model.load_state_dict(got)


def test_codec_round_trip_and_negotiation(make_hub, connect):
    hub = make_hub(codec="lz4")
    ones = np.ones((512, 512))
    full = connect(hub.url, client_id="full")
    hub.wait_for(1, timeout=T)
    limited = connect(hub.url, client_id="limited")
    limited.decoders = []  # announces it decodes nothing: must get raw bytes
    limited.reconnect(timeout=T)
    hub.wait_for(2, timeout=T)
    records = hub.broadcast({"x": ones})
    assert records["full"].codecs == "lz4" and records["full"].bytes_encoded < ones.nbytes / 10
    assert records["limited"].codecs == "raw" and records["limited"].bytes_encoded > ones.nbytes
    _assert_same(full.recv(timeout=T)["x"], ones)
    _assert_same(limited.recv(timeout=T)["x"], ones)
    for cid, codec in (("full", "lz4"), ("limited", "raw"), ("full", "lz4")):  # chosen per peer
        assert hub.send(cid, {"x": ones}).codecs == codec
    hub.set_codec(None)  # a new codec: the choice is made again
    assert hub.send("full", {"x": ones}).codecs == "raw"
    for ch in (full, full, limited, full):
        _assert_same(ch.recv(timeout=T)["x"], ones)


def test_a_client_that_has_its_welcome_finds_the_hub_knowing_its_session(
    make_hub, connect, monkeypatch
):
    """The hub records a session (its codecs) before its welcome can reach the client: here
    the hub's thread is held up just as it records it, as a busy machine may hold it (the
    welcome used to go first, and a send right after a reconnect used the old session's
    codecs: lz4 to a client that had just said it decodes nothing)."""
    hub = make_hub(codec="lz4")
    member_from = hub._member_from

    def held_up(hello, session):
        time.sleep(0.3)  # not a wait for a state: the delay a preempted thread would see
        return member_from(hello, session)

    monkeypatch.setattr(hub, "_member_from", held_up)
    ones = np.ones((512, 512))
    ch = connect(hub.url, client_id="c")
    assert hub.send("c", {"x": ones}).codecs == "lz4"  # a member as soon as it is welcomed
    _assert_same(ch.recv(timeout=T)["x"], ones)
    ch.decoders = []
    ch.reconnect(timeout=T)
    assert hub.broadcast({"x": ones})["c"].codecs == "raw"  # its new session's codecs
    _assert_same(ch.recv(timeout=T)["x"], ones)


def test_broadcast_to_eight_and_gather(make_hub, connect):
    hub = make_hub()
    chans = [connect(hub.url, client_id=f"dev{i}") for i in range(8)]
    assert hub.wait_for(8, timeout=T) == sorted(f"dev{i}" for i in range(8))
    weights = {"w": np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)}
    records = hub.broadcast(weights, meta={"round": 3})
    assert sorted(records) == hub.clients
    for i, ch in enumerate(chans):
        msg = ch.recv(timeout=T)
        _assert_same(msg["w"], weights["w"])
        ch.send({"update": np.full(4, i, np.float32)}, meta={"samples": 10 * i})
    got = dict(hub.gather(timeout=T))
    assert sorted(got) == hub.clients
    for cid, msg in got.items():
        i = int(cid[3:])
        assert msg.meta["samples"] == 10 * i and msg["update"][0] == i


def test_gather_timeout_names_missing_clients(make_hub, connect):
    hub = make_hub()
    a = connect(hub.url, client_id="a")
    connect(hub.url, client_id="b")
    hub.wait_for(2, timeout=T)
    a.send({"u": np.zeros(3)})
    seen = []
    with pytest.raises(GatherTimeout) as info:
        for cid, _ in hub.gather(timeout=0.5):
            seen.append(cid)
    assert seen == ["a"] and info.value.missing == ["b"]


def test_client_leaving_mid_gather_is_not_waited_for(make_hub, connect):
    hub = make_hub()
    a = connect(hub.url, client_id="a")
    b = connect(hub.url, client_id="b")
    hub.wait_for(2, timeout=T)
    left = threading.Event()
    hub.on_leave = lambda cid, reason: left.set()

    gathering = threading.current_thread()

    def leave_later() -> None:
        until_inside(gathering, "gather")
        b.close()

    threading.Thread(target=leave_later).start()
    a.send({"u": np.ones(2)})
    t = time.monotonic()
    got = [cid for cid, _ in hub.gather(timeout=T)]
    assert got == ["a"] and time.monotonic() - t < T / 2
    assert left.wait(T) and hub.clients == ["a"]


def test_message_sent_just_before_close_is_delivered(make_hub, connect):
    # The end of a federated run: the hub says done, each client answers and closes at once.
    hub = make_hub()
    chans = [connect(hub.url, client_id=f"dev{i}") for i in range(4)]
    devices = hub.wait_for(4, timeout=T)
    hub.broadcast(None, meta={"done": True}, clients=devices)
    last = np.random.default_rng(2).standard_normal(1 << 19).astype(np.float32)  # 2 MiB
    for i, ch in enumerate(chans):
        assert ch.recv(timeout=T).meta == {"done": True}
        ch.send({"last": last}, meta={"records": [i]})
        ch.close()
    got = dict(hub.gather(timeout=T, clients=devices))
    assert sorted(got) == devices
    for cid, msg in got.items():
        assert msg.meta == {"records": [int(cid[3:])]}
        _assert_same(msg["last"], last)


def test_timeouts_are_typed(make_hub, connect):
    hub = make_hub()
    with pytest.raises(TransportTimeout):
        hub.wait_for(1, timeout=0.2)
    ch = connect(hub.url, client_id="x")
    hub.wait_for(1, timeout=T)
    with pytest.raises(TransportTimeout):
        ch.recv(timeout=0.2)
    with pytest.raises(TransportTimeout):
        hub.recv(timeout=0.2)
    hub.send("x", {"v": np.arange(3)})  # still usable after the timeouts
    _assert_same(ch.recv(timeout=T)["v"], np.arange(3))


def test_send_to_unknown_client_raises(make_hub):
    hub = make_hub()
    with pytest.raises(PeerGone):
        hub.send("nobody", {"v": np.zeros(1)})


def test_reconnect_after_dropped_connection(make_hub, connect):
    hub = make_hub()
    ch = connect(hub.url, client_id="r")
    hub.wait_for(1, timeout=T)
    ch._drop()  # the connection dies without a goodbye
    deadline = time.monotonic() + T
    while hub.clients and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hub.clients == []
    ch.reconnect(timeout=T)
    hub.wait_for(1, timeout=T)
    hub.send("r", {"v": np.arange(5)})
    _assert_same(ch.recv(timeout=T)["v"], np.arange(5))
    ch.send({"v": np.arange(4)})
    assert hub.recv(timeout=T)[0] == "r"


def test_recv_into_out_reuses_arrays(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="o")
    hub.wait_for(1, timeout=T)
    hub.send("o", {"a": np.arange(1000.0), "b": {"c": np.ones((4, 4), np.float32)}})
    first = ch.recv(timeout=T)
    hub.send("o", {"a": np.arange(1000.0) * 2, "b": {"c": np.zeros((4, 4), np.float32)}})
    second = ch.recv(timeout=T, out=first.tensors)
    assert second["a"] is first["a"] and second["b"]["c"] is first["b"]["c"]
    _assert_same(second["a"], np.arange(1000.0) * 2)


def test_records_account_for_bytes_and_time(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="rec")
    hub.wait_for(1, timeout=T)
    arr = np.ones((1000, 100), np.float32)
    sent = hub.send("rec", {"x": arr})
    msg = ch.recv(timeout=T)
    got = msg.record
    assert sent.bytes_raw == got.bytes_raw == arr.nbytes
    assert sent.bytes_encoded == got.bytes_encoded > arr.nbytes
    assert sent.direction == "send" and got.direction == "recv" and got.peer == "hub"
    assert sent.wall_s >= sent.wire_s > 0 and got.wall_s >= got.decode_s >= 0
    assert got.e2e_s is not None and got.e2e_s >= 0
    assert hub.records[-1] is sent and ch.records[-1] is got


def test_channel_waits_for_a_hub_that_starts_later(scheme_module, request):
    later_url = scheme_hooks.optional(scheme_module, "later_hub_url")
    if later_url is None:
        pytest.skip("no URL to dial before its hub exists (a port would be picked to bind later)")
    url = later_url(request)
    result: dict[str, object] = {}
    missed = threading.Event()  # the channel tried, found no hub, and goes on trying
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: missed.set() if "cannot reach" in record.getMessage() else None
    logger = logging.getLogger("tensorwire.transports")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)

    def client() -> None:
        with tensorwire.connect(url, client_id="early", timeout=T) as ch:
            result["msg"] = ch.recv(timeout=T)

    t = threading.Thread(target=client)
    try:
        t.start()
        assert missed.wait(T), "the channel never said it could not reach the hub"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    with tensorwire.serve(url) as hub:
        hub.wait_for(1, timeout=T)
        hub.send("early", {"v": np.arange(3)})
        t.join(T)
    assert np.array_equal(result["msg"]["v"], np.arange(3))


@pytest.mark.slow
def test_one_gib_message(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="big", codec=None)
    hub.wait_for(1, timeout=T)
    big = np.arange(1 << 28, dtype=np.float32)  # 1 GiB
    result: dict[str, object] = {}
    t = threading.Thread(target=lambda: result.update(msg=ch.recv(timeout=120)))
    t.start()
    hub.send("big", {"big": big}, timeout=120)
    t.join(150)
    got = result["msg"]["big"]
    assert got.nbytes == 1 << 30 and np.array_equal(got[:: 1 << 16], big[:: 1 << 16])
    assert np.array_equal(got, big)


def test_garbage_at_the_transport_level_is_dropped_and_others_served(
    scheme, scheme_module, make_hub, connect
):
    inject = scheme_module.inject_garbage
    hub = make_hub()
    good = connect(hub.url, client_id="good")
    hub.wait_for(1, timeout=T)
    inject(hub.url)
    deadline = time.monotonic() + T
    while not hub.errors and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hub.errors, "the garbage was neither reported nor refused"
    assert all(isinstance(e, tensorwire.WireError) for _, e in hub.errors)
    assert "good" in hub.clients
    hub.send("good", {"v": np.arange(3)})
    _assert_same(good.recv(timeout=T)["v"], np.arange(3))
    good.send({"v": np.arange(2)})
    assert hub.recv(timeout=T)[0] == "good"


def test_the_codec_choice_kept_per_peer_decoder_set_stays_bounded():
    """Peers choose the decoder sets they announce: a hub keeps its codec choice for at most
    64 of them, whatever a stream of strangers announces."""
    from tensorwire.transports.base import _MAX_DECODER_SETS

    hub = tensorwire.serve("tcp://127.0.0.1:0", codec="lz4")
    try:
        big = {"x": np.ones((256, 256))}
        for i in range(10 * _MAX_DECODER_SETS):
            enc = hub._encode_for(big, None, frozenset({"lz4", f"made-up-{i}"}))
            assert enc.codec_label == "lz4"
            assert len(hub._codecs_for) <= _MAX_DECODER_SETS
        assert hub._encode_for(big, None, frozenset()).codec_label == "raw"  # decodes nothing
    finally:
        hub.close()
