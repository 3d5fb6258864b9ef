"""A secured FedAvg run: only enrolled devices take part, and the hijack of an unsecured run
(a stranger joins as a device and sends absurd weights) is refused without a trace in the
model."""

from __future__ import annotations

import subprocess
import threading
import time

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

import tensorwire
from tensorwire.errors import TransportError
from tensorwire.fl import FLConfig, run_server
from tensorwire.fl.run import device_command
from tensorwire.transports.certs import make_certs


def _run(cfg: FLConfig, certs, attack: bool) -> tuple[list[dict], list[Exception]]:
    procs: list[subprocess.Popen[bytes]] = []
    attackers: list[threading.Thread] = []
    refused: list[Exception] = []
    done_at: list[float] = []
    stolen = make_certs(certs.parent / "elsewhere", hosts=["127.0.0.1"], clients=["device-2"])

    def hijack(url: str) -> None:
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
                    ch.send(poison, meta={"round": 1, "samples": 10**9})
            except TransportError as exc:
                refused.append(exc)
        done_at.append(time.monotonic())

    def spawn(url: str) -> None:
        for i in range(1, cfg.clients + 1):
            procs.append(
                subprocess.Popen(
                    device_command(url, i, cfg.round_timeout, certs),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        if attack:
            attackers.append(threading.Thread(target=hijack, args=(url,), daemon=True))
            attackers[0].start()

    try:
        result = run_server("tcp://127.0.0.1:0", cfg, on_ready=spawn, certs=certs)
        if attack:
            assert done_at and done_at[0] < time.monotonic(), "the attack outlived the run"
    finally:
        for p in procs:
            p.wait(timeout=60)
        for t in attackers:
            t.join(60)
    return result.rounds, refused


def test_a_hijack_of_a_secured_run_is_refused_and_changes_nothing(tmp_path):
    cfg = FLConfig(
        dataset="synthetic", model="vgg5", clients=2, rounds=3, batch_size=50, round_timeout=300
    )
    certs = tmp_path / "certs"
    make_certs(certs, hosts=["127.0.0.1"], clients=["device-1", "device-2"])
    clean, _ = _run(cfg, certs, attack=False)
    attacked, refused = _run(cfg, certs, attack=True)
    assert len(refused) == 3, refused
    assert [r["accuracy"] for r in attacked] == [r["accuracy"] for r in clean]
    assert [r["test_loss"] for r in attacked] == pytest.approx(
        [r["test_loss"] for r in clean], rel=1e-9
    )
    assert all(np.isfinite(r["test_loss"]) for r in attacked)
