"""Your own model and data over ``tensorwire.fl.serve`` / ``join``, on two transports; 32
devices sampled a quarter at a time while a fifth of them lose their link every round;
best-effort udp losses; a member that floods the server."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

import tensorwire  # noqa: E402
from tensorwire import fl  # noqa: E402
from tensorwire.fl import ModelMismatch  # noqa: E402
from tensorwire.fl.server import recorder as fl_recorder  # noqa: E402
from tensorwire.transports import KNOWN_TRANSPORTS, local_hub_url  # noqa: E402

FEATURES, CLASSES = 16, 4


def make_model() -> nn.Module:
    """The user's model: nothing tensorwire knows about."""
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def other_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, CLASSES))


def blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Four Gaussian blobs in 16 dimensions (the same centres for every seed)."""
    centres = np.random.default_rng(1234).standard_normal((CLASSES, FEATURES)) * 1.5
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, n)
    x = centres[y] + rng.standard_normal((n, FEATURES))
    return x.astype(np.float32), y.astype(np.int64)


def dataset(n: int, seed: int) -> TensorDataset:
    x, y = blobs(n, seed)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def _protocols() -> list:
    return [
        p if p in KNOWN_TRANSPORTS else pytest.param(p, marks=pytest.mark.skip(f"no {p}://"))
        for p in ("tcp", "mqtt")
    ]


@pytest.mark.parametrize("protocol", _protocols())
@pytest.mark.parametrize("strategy", ["fedavg", "fedprox"])
def test_a_users_own_model_trains_over_the_api(protocol, strategy):
    errors: dict[str, BaseException] = {}
    trained: dict[str, int] = {}

    def device(url: str, cid: str, model, seed: int) -> None:
        try:
            trained[cid] = fl.join(
                url, model=model, train_data=dataset(120, seed), client_id=cid, timeout=60
            )
        except BaseException as exc:  # the thread's outcome, for the test to see
            errors[cid] = exc

    threads: list[threading.Thread] = []

    def spawn(url: str) -> None:
        plan = [("a", make_model, 1), ("b", make_model, 2), ("odd", other_model, 3)]
        for cid, model, seed in plan:
            threads.append(threading.Thread(target=device, args=(url, cid, model, seed)))
            threads[-1].start()

    with local_hub_url(protocol) as url:
        result = fl.serve(
            url,
            model=make_model,
            test_data=blobs(400, 99),
            strategy=strategy,
            rounds=3,
            clients=3,
            batch_size=16,
            lr=0.05,
            round_timeout=60,
            on_ready=spawn,
        )
    for t in threads:
        t.join(30)
    accuracy = [r["accuracy"] for r in result.rounds]
    assert accuracy[-1] > 0.8, accuracy  # four classes: chance is 0.25
    assert trained == {"a": 3, "b": 3}
    assert isinstance(errors.pop("odd"), ModelMismatch) and not errors
    failed = [u for u in result.updates if u["device"] == "odd"]
    assert failed and failed[0]["status"] in ("failed", "left")
    # Why it failed is recorded: in its round's row, or, where its goodbye overtook its error
    # (a broker delivers them on different topics) and the round ended in between, as an event.
    said = [u["reason"] for u in failed if u["status"] == "failed"]
    said += [e["reason"] for e in result.events if e["device"] == "odd" and e["kind"] == "failed"]
    assert any("0.weight" in reason for reason in said), (failed, result.events)
    assert result.config.model.endswith("test_fl_api:make_model")


class LinkCutter:
    """A TCP relay per device in front of a hub: ``cut(i, s)`` closes device i's link and
    refuses it for ``s`` seconds (its device sees the server vanish, and reconnects)."""

    def __init__(self, target: tuple[str, int], n: int) -> None:
        self.target = target
        self.listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
        self.down_until = [0.0] * n
        self.live: list[list[socket.socket]] = [[] for _ in range(n)]
        self.lock = threading.Lock()
        self.closed = False
        self.threads = [
            threading.Thread(target=self._accept, args=(i,), daemon=True) for i in range(n)
        ]
        for t in self.threads:
            t.start()

    def port(self, i: int) -> int:
        return self.listeners[i].getsockname()[1]

    def _accept(self, i: int) -> None:
        listener = self.listeners[i]
        listener.settimeout(0.2)
        while not self.closed:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                down = time.monotonic() < self.down_until[i] or self.closed
            if down:
                conn.close()
                continue
            try:
                up = socket.create_connection(self.target)
            except OSError:  # the hub is gone
                conn.close()
                continue
            with self.lock:
                self.live[i] += [conn, up]
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self, i: int, seconds: float) -> None:
        with self.lock:
            self.down_until[i] = time.monotonic() + seconds
            doomed, self.live[i] = self.live[i], []
        for s in doomed:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.closed = True
        for i in range(len(self.listeners)):
            self.cut(i, 0)
            self.listeners[i].close()


def test_32_devices_a_quarter_per_round_a_fifth_dropping_each_round():
    """Each round samples a quarter of the devices available; after each round a fifth of
    all devices lose their link for about a round (the next round loses those it sampled
    among them, or cannot sample them) and then reconnect."""
    n, rounds, quorum = 32, 10, 2
    rng = np.random.default_rng(7)
    cutter: list[LinkCutter] = []
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def device(port: int, i: int) -> None:
        try:
            fl.join(
                f"tcp://127.0.0.1:{port}",
                model=make_model,
                train_data=dataset(1000, i),
                client_id=f"d{i:02d}",
                timeout=10,  # offline when the run ends: gives up 10 s later
            )
        except BaseException as exc:
            errors.append(exc)

    def spawn(url: str) -> None:
        host, port = url.removeprefix("tcp://").rsplit(":", 1)
        cutter.append(LinkCutter((host, int(port)), n))
        for i in range(n):
            threads.append(threading.Thread(target=device, args=(cutter[0].port(i), i)))
            threads[-1].start()

    def drop_a_fifth(row: dict) -> None:
        """Offline for about a round (as long as the last one took), then they redial."""
        if row["round"] < rounds:
            for i in rng.choice(n, size=n // 5, replace=False).tolist():
                cutter[0].cut(i, max(row["round_s"], 0.1))

    try:
        result = fl.serve(
            "tcp://127.0.0.1:0",
            model=make_model,
            test_data=blobs(400, 99),
            rounds=rounds,
            clients=n,
            fraction=0.25,
            min_updates=quorum,
            downlink="delta",
            batch_size=16,
            lr=0.05,
            round_timeout=30,
            join_timeout=60,
            on_ready=spawn,
            on_round=drop_a_fifth,
        )
    finally:
        if cutter:
            cutter[0].close()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads)
    rows = result.rounds
    assert [r["round"] for r in rows] == list(range(1, rounds + 1))
    assert sum(r["status"] == "aggregated" for r in rows) >= rounds - 1  # quorum: 2 of 5-8
    for r in rows:  # a quarter of those available (rounded up), never fewer than the quorum
        assert len(r["sampled"]) == max(-(-r["available"] // 4), quorum), r
    assert rows[0]["available"] == n and min(r["available"] for r in rows[1:]) < n
    events = result.events
    left = [e for e in events if e["kind"] == "left" and e["round"] < rounds]
    back = [e for e in events if e["kind"] == "joined" and e["round"] > 1]
    assert len(left) >= 2 * (n // 5) and len(back) >= n // 5  # links dropped, devices came back
    assert not [e for e in events if e["kind"] == "resync"]  # no delta against a missed model
    assert rows[-1]["accuracy"] > 0.8, [r["accuracy"] for r in rows]
    assert not errors, errors
    per_round = sorted(r["round_s"] for r in rows)
    print(
        f"\n32 devices, fraction 0.25, a fifth dropping: {rounds} rounds, round_s median "
        f"{per_round[len(per_round) // 2]:.2f} s, max {per_round[-1]:.2f} s; available "
        f"{[r['available'] for r in rows]}, updates {[r['updates'] for r in rows]}"
    )


def wide_model() -> nn.Module:
    """~10k parameters: a message of ~28 datagrams, so one can be lost and the rest used."""
    return nn.Sequential(nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, CLASSES))


@pytest.mark.skipif("udp" not in KNOWN_TRANSPORTS, reason="no udp://")
def test_best_effort_udp_losses_reach_the_aggregation_and_lossy_deltas_are_refused(monkeypatch):
    """One datagram of every multi-datagram message is lost. The server's updates then
    report the lost fraction (what loss-aware averaging weighs, per entry); a device refuses
    a delta with a gap and asks for the whole model; training goes on."""
    from tensorwire.transports.udp import sending as udp_sending

    real = udp_sending.send_datagram

    def lossy(sock, parts, address, deadline):
        head = bytes(parts[0][-40:])  # a chunk's header ends a datagram's clear part
        index, count = struct.unpack_from("<II", head, 16)
        if count > 10 and index == 5:
            return
        real(sock, parts, address, deadline)

    monkeypatch.setattr(udp_sending, "send_datagram", lossy)
    threads: list[threading.Thread] = []

    def spawn(url: str) -> None:
        for cid, seed in (("a", 1), ("b", 2)):
            kwargs = {"model": wide_model, "train_data": dataset(200, seed), "client_id": cid}
            threads.append(threading.Thread(target=fl.join, args=(url,), kwargs=kwargs))
            threads[-1].start()

    result = fl.serve(
        "udp://127.0.0.1:0?mode=best-effort&mtu=1472",
        model=wide_model,
        test_data=blobs(400, 99),
        rounds=3,
        clients=2,
        batch_size=16,
        lr=0.05,
        downlink="delta",
        round_timeout=60,
        on_ready=spawn,
    )
    for t in threads:
        t.join(30)
    assert [r["status"] for r in result.rounds] == ["aggregated"] * 3
    applied = [u for u in result.updates if u["status"] == "applied"]
    assert len(applied) == 6
    assert all(0 < u["lost_max"] < 0.2 for u in applied)  # one datagram of an entry's bytes
    resyncs = [e for e in result.events if e["kind"] == "resync"]
    assert len(resyncs) >= 2  # rounds 2 and 3 sent deltas, each lost a datagram
    assert result.rounds[-1]["accuracy"] > 0.8


# -- a member that floods ---------------------------------------------------------------

FLOOD = 200  # of each kind, per round


def _flooder(url: str, told: list[dict]) -> None:
    with tensorwire.connect(url, client_id="x", codec=None, timeout=30) as ch:
        while True:
            msg = ch.recv(timeout=120)
            kind = msg.meta.get("fl")
            if kind == "setup":
                ch.send(None, {"fl": "ready", "nonce": "x"})
            elif kind == "verdict":
                told.append(msg.meta)
            elif kind == "done":
                return
            elif kind == "round":
                r = msg.meta["round"]
                bad = {"update": {"0.weight": np.zeros((2, 2), np.float32)}}
                for _ in range(FLOOD):
                    ch.send(None, {"fl": "nonsense", "blob": "x" * 100})
                    ch.send(bad, {"fl": "update", "round": r, "samples": 5})
                    ch.send(None, {"fl": "resync", "round": r})


def test_a_flooding_member_changes_nothing_and_costs_little(monkeypatch):
    """It gets no more than it is owed: one verdict per round, one resend per round, a
    bounded event log; the honest devices' rounds go on as if it were not there."""
    monkeypatch.setattr(fl_recorder, "MAX_EVENT_ROWS", 100)
    threads: list[threading.Thread] = []
    told: list[dict] = []

    def spawn(url: str) -> None:
        jobs = [
            (fl.join, (url,), {"model": make_model, "train_data": dataset(120, s), "client_id": c})
            for c, s in (("a", 1), ("b", 2))
        ]
        jobs.append((_flooder, (url, told), {}))
        for target, args, kwargs in jobs:
            threads.append(threading.Thread(target=target, args=args, kwargs=kwargs, daemon=True))
            threads[-1].start()

    result = fl.serve(
        "tcp://127.0.0.1:0",
        model=make_model,
        test_data=blobs(400, 99),
        rounds=3,
        clients=3,
        batch_size=16,
        lr=0.05,
        downlink="delta",
        round_timeout=60,
        on_ready=spawn,
    )
    for t in threads:
        t.join(60)
    for row in result.rounds:
        assert row["applied"] == ["a", "b"] and row["rejected"] == ["x"]
    assert result.rounds[-1]["accuracy"] > 0.8
    assert len(told) <= 4 and all(v["status"] == "rejected" for v in told)  # once a round
    assert "missing '0.bias'" in told[0]["reason"]
    models = Counter(
        t["round"]
        for t in result.transfers
        if t["device"] == "x" and t["side"] == "server" and t["payload"] == "model"
    )
    assert max(models.values()) <= 2  # the round's model, and at most one resend
    assert len(result.events) == 100  # the rest only counted
