"""``fl scale``, small: 50 devices held 25 to a process, a tenth of them per round, over tcp
and over mqtt on a private Mosquitto (never the machine's); what it reports is what happened."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from tensorwire.bench.many_devices import run_many, status_kib
from tensorwire.errors import MissingDependency
from tensorwire.fl import FLConfig

DEVICES = 50


@pytest.mark.timeout(900)
@pytest.mark.parametrize("protocol", ["tcp", "mqtt"])
def test_fifty_devices_in_two_processes_run_two_rounds(protocol, tmp_path):
    if protocol == "mqtt":
        pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    cfg = FLConfig(
        dataset="synthetic",
        model="mlp",
        clients=DEVICES,
        rounds=2,
        fraction=0.1,
        join_timeout=600,
        round_timeout=300,
    )
    try:
        row = run_many(cfg, protocol, tmp_path / protocol, devices_per_process=25)
    except MissingDependency as exc:
        pytest.skip(str(exc))
    assert row["rounds"] == 2 and row["sampled/round"] == 5
    assert row["updates"] == 10  # every sampled device answered
    assert 0 < row["server RSS ready MiB"] <= row["server peak MiB"]
    assert row["round s (median)"] > 0 and row["join s (wall, all)"] > 0
    if protocol == "mqtt":
        assert row["broker peak MiB"] > 0
    else:
        assert row["broker peak MiB"] is None
    manifest = json.loads((tmp_path / protocol / "manifest.json").read_text())
    processes = manifest["placement"]["processes"]
    assert [(p["first"], p["count"]) for p in processes] == [(1, 25), (26, 25)]
    events = pq.read_table(tmp_path / protocol / "events.parquet").to_pylist()
    joined = {e["device"] for e in events if e["kind"] == "joined"}
    assert joined == {f"device-{i}" for i in range(1, DEVICES + 1)}


def test_status_of_a_process_that_is_gone_is_zero():
    assert status_kib(2**22 + 1, "VmHWM") == 0
    assert status_kib("self", "VmRSS") > 0
