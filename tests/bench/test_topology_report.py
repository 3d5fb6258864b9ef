"""The topology section's numbers from made-up tables: speed-ups over tcp on the same
topology, the copies a shared link carried, sequential vs concurrent, the slowest link."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tensorwire.bench.fl_matrix import Experiment, Matrix, fanout_of, transport_of
from tensorwire.bench.topology_report import (
    fanout_table,
    mixed_links_table,
    topology_table,
    verdicts,
)


def _rounds(rows):
    base = {"model": "vgg5", "profile": "4g", "loss": 0.0, "rep": 0, "links": "uniform"}
    return pd.DataFrame([{**base, **r} for r in rows])


def _devices(key, topology, protocol, downs, ups, links="uniform", names=None):
    return pd.DataFrame(
        {
            "key": key,
            "topology": topology,
            "protocol": protocol,
            "links": links,
            "round": 1,
            "device": [f"device-{i}" for i in range(1, len(downs) + 1)],
            "link": names or ["4g"] * len(downs),
            "down_s": downs,
            "up_s": ups,
            "comm_s": np.add(downs, ups),
        }
    )


@pytest.fixture
def tables():
    frame = _rounds(
        [
            {"key": "a", "topology": "star", "protocol": "tcp", "round": 1, "comm_s": 8.0},
            {
                "key": "b",
                "topology": "star",
                "protocol": "tcp-sequential",
                "round": 1,
                "comm_s": 14.0,
            },
            {
                "key": "c",
                "topology": "shared-broker-near",
                "protocol": "tcp",
                "round": 1,
                "comm_s": 32.0,
                "shared_down_bytes": 4.1e6,
                "shared_down_copies": 4.1,
            },
            {
                "key": "d",
                "topology": "shared-broker-near",
                "protocol": "mqtt",
                "round": 1,
                "comm_s": 16.0,
                "shared_down_bytes": 1.05e6,
                "shared_down_copies": 1.05,
            },
        ]
    ).assign(lower_bound_s=8.0)
    devices = pd.concat(
        [
            _devices("a", "star", "tcp", [1, 1, 1, 1], [1, 1, 1, 1]),
            _devices("b", "star", "tcp-sequential", [1, 2, 3, 4], [1, 1, 1, 1]),
            _devices("c", "shared-broker-near", "tcp", [4, 4, 4, 4], [4, 4, 4, 4]),
            _devices("d", "shared-broker-near", "mqtt", [1, 1, 1, 1], [3, 3, 3, 3]),
        ]
    )
    return frame, devices


def test_protocols_are_compared_with_tcp_on_the_same_topology(tables):
    table = topology_table(*tables).set_index(["topology", "protocol"])
    assert table.loc[("shared-broker-near", "mqtt"), "x_tcp"] == pytest.approx(2.0)
    assert table.loc[("shared-broker-near", "mqtt"), "down_x_tcp"] == pytest.approx(4.0)
    assert table.loc[("shared-broker-near", "mqtt"), "shared_down_copies"] == pytest.approx(1.05)
    assert table.loc[("star", "tcp"), "x_tcp"] == pytest.approx(1.0)
    assert np.isnan(table.loc[("star", "tcp"), "shared_down_copies"])


def test_sequential_unicast_against_the_concurrent_broadcast(tables):
    fanout = fanout_table(topology_table(*tables))
    assert list(fanout["topology"]) == ["star"]
    assert fanout["slowdown"].iloc[0] == pytest.approx(14.0 / 8.0)
    assert fanout["down_slowdown"].iloc[0] == pytest.approx(10.0 / 4.0)


def test_the_verdicts_say_who_wins_where_and_the_copies(tables):
    table = topology_table(*tables)
    said = " ".join(verdicts(table, fanout_table(table), pd.DataFrame()))
    assert "shared-broker-near, 4g: mqtt is 2.00x faster than concurrent tcp" in said
    assert "crossed the shared link 1.05 times" in said
    assert "sequential unicast (FedComm's tcp server) takes 1.75x" in said


def test_the_slowest_link_is_named_with_what_it_costs():
    devices = _devices(
        "m",
        "star",
        "amqp",
        [4, 1, 1, 0.4],
        [4, 1, 1, 0.4],
        links="3g,4g,4g,wifi",
        names=["3g", "4g", "4g", "wifi"],
    )
    row = mixed_links_table(devices).iloc[0]
    assert (row.slowest_device, row.slowest_link) == ("device-1", "3g")
    assert row.slowest_s == pytest.approx(8.0) and row.median_s == pytest.approx(2.0)
    assert row.straggler_x == pytest.approx(4.0)
    assert "device-4 (wifi) 0.80 s" in row.per_device
    said = verdicts(pd.DataFrame(), pd.DataFrame(), mixed_links_table(devices))
    assert said == [
        "star, links 3g,4g,4g,wifi: with amqp the slowest device (device-1 on 3g) spends "
        "8.00 s per round communicating, 4.00x the median device's 2.00 s (+6.00 s)."
    ]


def test_no_tables_no_section():
    assert topology_table(pd.DataFrame(), pd.DataFrame()).empty
    assert fanout_table(pd.DataFrame()).empty and mixed_links_table(pd.DataFrame()).empty


def test_sequential_tcp_is_tcp_with_another_fanout():
    assert transport_of("tcp-sequential").scheme == "tcp"
    assert (fanout_of("tcp-sequential"), fanout_of("tcp")) == ("sequential", "concurrent")


def test_topology_and_links_name_the_experiment_and_a_mixed_star_runs_once():
    exp = Experiment("mqtt", topology="shared-broker-near", links="3g,4g", clients=2)
    assert exp.key.startswith("mqtt_vgg5_4g_")
    assert "_topo-shared-broker-near_links-3g-4g_" in exp.key
    star = Experiment("tcp", profile="wifi", links=("3g", "4g"), clients=2, loss=0.05)
    assert star.profile == "mixed" and "_mixed_" in star.key
    assert [p.loss for p in star.device_profiles()] == [0.05, 0.05]
    assert star.link_profile().rate == 5e6  # the slowest device's
    shared = Experiment("tcp", topology="shared", links=("3g", "4g"), clients=2, loss=0.05)
    assert [p.loss for p in shared.device_profiles()] == [0.0, 0.0]  # loss on the shared link
    assert shared.link_profile().loss == 0.05
    matrix = Matrix(
        protocols=("tcp",), profiles=("3g", "4g"), clients=2, links=((), ("3g", "wifi"))
    )
    keys = [e.key for e in matrix.experiments()]
    assert len(keys) == 3 == len(set(keys))  # 3g, 4g, and one mixed star
    assert Matrix.from_config(matrix.to_config()) == matrix


@pytest.mark.parametrize(
    "fields,error",
    [
        ({"topology": "ring"}, "topology 'ring'"),
        ({"links": "3g,4g", "clients": 4}, "one profile per device"),
        ({"links": "3g,warp", "clients": 2}, "warp"),
        ({"profile": "mixed"}, "profile 'mixed'"),
    ],
)
def test_bad_topologies_and_links_fail_when_the_experiment_is_made(fields, error):
    with pytest.raises(Exception, match=error):
        Experiment("tcp", **fields)
