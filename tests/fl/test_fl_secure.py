"""A secured run: only enrolled devices take part. A stranger's hijack (joining as a device
with absurd weights) is refused at the door; an enrolled device that sends absurd weights
(+1e3, samples=10**9) is rejected by validation, told why, and changes nothing."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

import tensorwire
from tensorwire.errors import TransportError
from tensorwire.fl import FLConfig, run_client, run_server
from tensorwire.transports.certs import make_certs
from tensorwire.transports.security import credentials_from_dir

CFG = FLConfig(
    dataset="synthetic", model="vgg5", clients=3, rounds=3, batch_size=50, round_timeout=300
)


def _stranger(url: str, certs, refused: list[Exception]) -> None:
    """Three ways in without device-2's enrolment; each must be refused."""
    stolen = make_certs(certs.parent / "elsewhere", hosts=["127.0.0.1"], clients=["device-2"])
    poison = {"update": {"w": np.full(10, 1e3, np.float32)}}
    attempts = [
        {},  # knowing only the URL
        {"tls": tensorwire.TLS(ca=certs / "ca.pem")},  # TLS, but no credential
        {  # a certificate and secret of another CA's "device-2"
            "tls": tensorwire.TLS(
                cert=stolen.devices["device-2"]["cert"],
                key=stolen.devices["device-2"]["key"],
                ca=certs / "ca.pem",
            ),
            "key": stolen.devices["device-2"]["secret"],
        },
    ]
    for options in attempts:
        try:
            with tensorwire.connect(url, client_id="device-2", timeout=2, **options) as ch:
                ch.send(poison, meta={"fl": "update", "round": 1, "samples": 10**9})
        except TransportError as exc:
            refused.append(exc)


def _device_3(url: str, certs, attack: bool, told: list[dict]) -> None:
    """Enrolled device-3: sends +1e3 everywhere with samples=10**9 (attack), or says it
    cannot train (the clean run's stand-in, so both runs aggregate the same two devices)."""
    security = credentials_from_dir(certs, "channel", "device-3")
    with tensorwire.connect(url, client_id="device-3", timeout=60, **security) as ch:
        while True:
            msg = ch.recv(timeout=300)
            kind = msg.meta.get("fl")
            if kind == "setup":
                ch.send(None, {"fl": "ready", "nonce": "device-3"})
            elif kind == "verdict":
                told.append(msg.meta)
            elif kind == "done":
                return
            elif kind == "round" and attack:
                weights = msg.tensors["weights"]
                poison = {
                    k: np.full_like(v, 1e3) if v.dtype.kind == "f" else v
                    for k, v in weights.items()
                }
                meta = {"fl": "update", "round": msg.meta["round"], "samples": 10**9}
                ch.send({"update": poison}, meta)
            elif kind == "round":
                ch.send(None, {"fl": "error", "round": msg.meta["round"], "error": "abstains"})


def _run(certs, attack: bool) -> dict:
    threads: list[threading.Thread] = []
    refused: list[Exception] = []
    told: list[dict] = []

    def spawn(url: str) -> None:
        jobs = [(run_client, (url, f"device-{i}"), {"certs": certs}) for i in (1, 2)]
        jobs.append((_device_3, (url, certs, attack, told), {}))
        if attack:
            jobs.append((_stranger, (url, certs, refused), {}))
        for target, args, kwargs in jobs:
            threads.append(threading.Thread(target=target, args=args, kwargs=kwargs, daemon=True))
            threads[-1].start()

    result = run_server("tcp://127.0.0.1:0", CFG, on_ready=spawn, certs=certs)
    done = time.monotonic()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a device or the attack outlived the run"
    return {"result": result, "refused": refused, "told": told, "done": done}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    certs = tmp_path_factory.mktemp("secure") / "certs"
    make_certs(certs, hosts=["127.0.0.1"], clients=["device-1", "device-2", "device-3"])
    return {"clean": _run(certs, attack=False), "attacked": _run(certs, attack=True)}


def test_a_hijack_of_a_secured_run_is_refused_and_changes_nothing(runs):
    clean, attacked = runs["clean"]["result"], runs["attacked"]["result"]
    assert len(runs["attacked"]["refused"]) == 3, runs["attacked"]["refused"]
    assert [r["accuracy"] for r in attacked.rounds] == [r["accuracy"] for r in clean.rounds]
    assert [r["test_loss"] for r in attacked.rounds] == pytest.approx(
        [r["test_loss"] for r in clean.rounds], rel=1e-9
    )
    assert all(np.isfinite(r["test_loss"]) for r in attacked.rounds)
    assert clean.rounds[-1]["accuracy"] > 0.2  # it did learn (chance: 0.1)


def test_an_enrolled_device_sending_absurd_weights_is_rejected_and_told(runs):
    attacked = runs["attacked"]["result"]
    for row in attacked.rounds:
        assert row["rejected"] == ["device-3"] and row["applied"] == ["device-1", "device-2"]
    rejected = [u for u in attacked.updates if u["device"] == "device-3"]
    assert [u["status"] for u in rejected] == ["rejected"] * CFG.rounds
    # the synthetic set's 400 samples in three shards (134, 133, 133): device-3 has the third
    reason = "samples 1000000000 is outside 1..133"
    assert all(u["reason"].startswith(reason) for u in rejected), rejected[0]["reason"]
    told = runs["attacked"]["told"]
    assert [(v["round"], v["status"]) for v in told] == [
        (r, "rejected") for r in range(1, CFG.rounds + 1)
    ]
    assert all(v["reason"].startswith(reason) for v in told)
