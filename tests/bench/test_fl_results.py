"""Per-round numbers from an experiment directory: lower bound, time split, counters."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tensorwire.bench.fl_results import experiment_frame, summarize

RATE = 8e6  # bits/s: a million bytes take one second


def _transfer(round_, side, role, direction, device, nbytes, **times):
    row = {
        "round": round_,
        "side": side,
        "role": role,
        "direction": direction,
        "device": device,
        "bytes_encoded": nbytes,
        "encode_s": 0.0,
        "wire_s": 0.0,
        "decode_s": 0.0,
        "wall_s": 0.0,
        "e2e_s": None,
    }
    row.update(times)
    return row


def _counters(point, round_, retrans, down, up):
    tcp = [
        {
            "kind": "tcp",
            "node": n,
            "ifname": None,
            "tcp_out_segs": 100 * round_,
            "tcp_retrans_segs": r,
        }
        for n, r in (("srv", retrans), ("dev1", 0))
    ]
    links = [
        {"kind": "link", "node": "srv", "ifname": "twb-x-br", "tx_bytes": 10**9, "rx_bytes": 0},
        {"kind": "link", "node": "srv", "ifname": "twb-x-s1", "tx_bytes": down, "rx_bytes": up},
        {"kind": "link", "node": "dev1", "ifname": "twb-x-d1", "tx_bytes": up, "rx_bytes": down},
    ]
    return [{"point": point, "round": round_, "time": 0.0, **r} for r in tcp + links]


@pytest.fixture
def experiment(tmp_path):
    d = tmp_path / "exp"
    d.mkdir()
    manifest = {
        "key": "tcp_x",
        "experiment": {
            "protocol": "tcp",
            "model": "vgg5",
            "profile": "4g",
            "loss": 0.0,
            "stress": "none",
            "uplink": "none",
            "ratio": 0.01,
            "rep": 0,
            "clients": 1,
            "dataset": "synthetic",
            "rounds": 2,
        },
        "label": "netns 4g: 20 Mbit/s",
        "shaped": True,
        "shaping": {"profile": {"loss": 0.0}},
        "link_rate_bps": {"downlink": RATE, "uplink": RATE / 2},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    rounds = [
        {
            "round": r,
            "accuracy": 0.5 + r / 10,
            "comm_s": 3.5,
            "uplink_bytes": 10**6,
            "downlink_bytes": 10**6,
        }
        for r in (1, 2)
    ]
    pd.DataFrame(rounds).to_parquet(d / "rounds.parquet")
    transfers = []
    for r in (1, 2):
        transfers += [
            _transfer(r, "server", "send", "downlink", "device-1", 10**6, encode_s=0.1),
            _transfer(r, "device", "recv", "downlink", "device-1", 10**6, decode_s=0.2, wire_s=1.0),
            _transfer(r, "device", "send", "uplink", "device-1", 10**6, encode_s=0.05),
            _transfer(r, "server", "recv", "uplink", "device-1", 10**6, wire_s=1.9),
        ]
    pd.DataFrame(transfers).to_parquet(d / "transfers.parquet")
    readings = (
        _counters("start", 0, 5, 1000, 2000)
        + _counters("round", 1, 7, 1_101_000, 1_102_000)
        + _counters("round", 2, 7, 2_201_000, 2_202_000)
        + _counters("end", 2, 9, 2_300_000, 2_300_000)
    )
    pd.DataFrame(readings).to_parquet(d / "counters.parquet")
    return d


def test_lower_bound_is_bytes_over_each_directions_rate_summed_like_comm_time(experiment):
    frame = experiment_frame(experiment)
    assert list(frame["round"]) == [1, 2]
    # 1 MB down at 8 Mbit/s (1 s) + 1 MB up at 4 Mbit/s (2 s)
    assert frame["lower_bound_s"].tolist() == pytest.approx([3.0, 3.0])
    assert frame["comm_over_bound"].tolist() == pytest.approx([3.5 / 3, 3.5 / 3])


def test_comm_time_splits_into_encode_wait_wire_decode(experiment):
    row = experiment_frame(experiment).iloc[0]
    assert row["encode_s"] == pytest.approx(0.15)  # the senders'
    assert row["decode_s"] == pytest.approx(0.2)  # the receivers' own work
    assert row["wire_s"] == pytest.approx(1.0 + 1.9)  # the receivers' first byte to last
    assert row["wait_s"] == pytest.approx(3.5 - 0.15 - 0.2 - 2.9)  # the rest of comm_s
    assert summarize(experiment_frame(experiment)).iloc[0]["wait_s"] == pytest.approx(0.25)


def test_tcp_retransmissions_are_not_applicable_to_a_protocol_that_is_not_tcp(experiment):
    manifest = json.loads((experiment / "manifest.json").read_text())
    assert experiment_frame(experiment)["retrans_segs"].notna().all()
    for protocol in ("udp", "udp-best-effort", "quic"):
        manifest["experiment"]["protocol"] = protocol
        (experiment / "manifest.json").write_text(json.dumps(manifest))
        frame = experiment_frame(experiment)
        assert frame["retrans_segs"].isna().all(), protocol  # n/a, not 0
        assert summarize(frame).iloc[0]["retrans_segs"] != 0


def test_counters_give_each_round_its_own_increase_bridge_left_out(experiment):
    frame = experiment_frame(experiment)
    assert frame["retrans_segs"].tolist() == [2, 0]
    assert frame["wire_down_bytes"].tolist() == [1_100_000, 1_100_000]
    assert frame["wire_up_bytes"].tolist() == [1_100_000, 1_100_000]
    assert frame["wire_bytes"].tolist() == [2_200_000, 2_200_000]
    assert set(frame["label"]) == {"netns 4g: 20 Mbit/s"}


def test_summary_has_one_row_per_setting_with_the_final_accuracy(experiment):
    table = summarize(experiment_frame(experiment))
    assert len(table) == 1
    row = table.iloc[0]
    assert row["protocol"] == "tcp" and row["reps"] == 1
    assert row["final_accuracy"] == pytest.approx(0.7)
    assert row["ratio"] == pytest.approx(7.0 / 6.0)
