"""The aggregation strategies on known numbers: FedAvg (and loss-aware weights), FedAdam and
FedYogi against their update rules, median and trimmed mean against an absurd update; a
round's plan (sampling, deadline, quorum) and the weight of a late update."""

from __future__ import annotations

import numpy as np
import pytest

from tensorwire.fl.config import FLConfig
from tensorwire.fl.server.device_manager import DeviceManager
from tensorwire.fl.strategies import (
    FedAdam,
    FedAvg,
    FedYogi,
    Median,
    TrimmedMean,
    Update,
    make_strategy,
    model_update,
)


def _u(client: str, w: list[float], n: int = 1, samples: int = 1, loss=None) -> Update:
    delta = {"w": np.array(w, np.float32), "n": np.array(n, np.int64)}
    return Update(client, 1, delta, samples, float(samples), loss or {})


G = {"w": np.array([1.0, 1.0], np.float32), "n": np.array(10, np.int64)}


def test_fedavg_is_the_sample_weighted_mean_and_counters_are_averaged_values():
    out = FedAvg().aggregate(G, [_u("a", [1, 2], 10, 1), _u("b", [5, -2], 13, 3)], {"w"})
    np.testing.assert_array_equal(out["w"], np.array([5.0, 0.0], np.float32))  # 1 + (1+15)/4
    assert out["w"].dtype == np.float32
    assert int(out["n"]) == 12  # (10 + 39) / 4 = 12.25 -> 12, a count, not a delta


def test_loss_aware_weights_each_tensor_by_what_arrived():
    a = _u("a", [4, 4], samples=1)
    b = _u("b", [0, 0], samples=1, loss={"w": 0.75})  # three quarters of b's "w" never came
    aware = FedAvg(loss_aware=True).aggregate(G, [a, b], {"w"})
    blind = FedAvg(loss_aware=False).aggregate(G, [a, b], {"w"})
    np.testing.assert_allclose(aware["w"], 1 + (4 * 1 + 0 * 0.25) / 1.25)  # 4.2
    np.testing.assert_allclose(blind["w"], 1 + 2.0)
    gone = FedAvg().aggregate(G, [_u("c", [9, 9], loss={"w": 1.0})], {"w"})
    np.testing.assert_array_equal(gone["w"], G["w"])  # nothing arrived: the model stays


def test_fedadam_and_fedyogi_follow_reddi_et_al():
    d = np.array([0.5, -1.0])
    for cls in (FedAdam, FedYogi):
        s = cls(lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
        out = s.aggregate(G, [_u("a", d.tolist())], {"w"})
        m = 0.1 * d
        v0 = np.full(2, 1e-6)
        v = 0.99 * v0 + 0.01 * d * d if cls is FedAdam else v0 - 0.01 * d * d * np.sign(v0 - d * d)
        np.testing.assert_allclose(out["w"], 1 + 0.1 * m / (np.sqrt(v) + 1e-3), rtol=1e-6)
        meta, arrays = s.state()
        again = cls(lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
        again.load_state(meta, arrays)
        a2 = again.aggregate(out, [_u("a", d.tolist())], {"w"})
        b2 = s.aggregate(out, [_u("a", d.tolist())], {"w"})
        np.testing.assert_array_equal(a2["w"], b2["w"])  # the checkpointed state is all of it
        assert meta == {"steps": 1}


def test_fedadam_averages_buffers_instead_of_stepping_them():
    g = {"w": np.zeros(1, np.float32), "bn.running_mean": np.zeros(1, np.float32)}
    ups = [
        Update(
            "a", 1, {"w": np.ones(1, np.float32), "bn.running_mean": np.ones(1, np.float32)}, 1, 1.0
        )
    ]
    out = FedAdam(lr=0.5).aggregate(g, ups, {"w"})
    assert out["bn.running_mean"][0] == 1.0  # the mean, as FedAvg
    assert 0 < out["w"][0] < 1.0  # a server step of lr * m / (sqrt(v) + tau)


@pytest.mark.parametrize("strategy", [Median(), TrimmedMean(trim=0.2)])
def test_robust_aggregators_ignore_one_absurd_update(strategy):
    honest = [_u(f"h{i}", [0.1 * i, -0.1 * i], samples=100) for i in range(4)]
    poison = _u("x", [1e3, 1e3], n=10**9, samples=10**6)
    out = strategy.aggregate(G, [*honest, poison], {"w"})
    assert np.abs(out["w"] - G["w"]).max() <= 0.3  # within the honest ones' range
    assert int(out["n"]) == 1  # the median / trimmed count, not 10**9
    mean = FedAvg().aggregate(G, [*honest, poison], {"w"})
    assert mean["w"].max() > 900  # what the plain mean does with it


def test_trimmed_mean_cuts_the_ends_per_coordinate():
    ups = [_u(str(i), [v, -v]) for i, v in enumerate([0.0, 1.0, 2.0, 3.0, 100.0])]
    out = TrimmedMean(trim=0.2).aggregate({"w": np.zeros(2, np.float32), "n": G["n"]}, ups, {"w"})
    np.testing.assert_allclose(out["w"], [2.0, -2.0])  # mean of 1, 2, 3


def test_the_config_names_the_strategy():
    assert isinstance(make_strategy(FLConfig(strategy="fedyogi")), FedYogi)
    assert make_strategy(FLConfig(strategy="fedprox")).name == "fedprox"
    assert make_strategy(FLConfig(strategy="trimmed-mean", trim=0.3)).trim == 0.3
    with pytest.raises(ValueError, match="strategy"):
        FLConfig(strategy="fedsgd")


def test_an_update_is_a_difference_for_floats_and_the_value_for_counters():
    g = {"w": np.arange(4, dtype=np.float32), "n": np.array(3)}
    local = {"w": g["w"] * 2, "n": np.array(5)}
    delta = model_update(local, g)
    np.testing.assert_array_equal(delta["w"], g["w"])
    assert int(delta["n"]) == 5  # counters travel as values
    back = FedAvg().aggregate(g, [Update("a", 1, delta, 1, 1.0)], {"w"})
    np.testing.assert_array_equal(back["w"], local["w"])  # one update: its local model
    assert int(back["n"]) == 5


def test_equal_weights_give_the_plain_mean():
    ups = [Update(str(i), 1, {"w": np.full(3, float(i))}, 7, 7.0) for i in range(4)]
    out = FedAvg().aggregate({"w": np.zeros(3)}, ups, {"w"})
    np.testing.assert_allclose(out["w"], np.full(3, 1.5))


def _pool(n: int) -> DeviceManager:
    devices = DeviceManager(None, n)
    for i in range(1, n + 1):
        dev = devices.joined(f"device-{i}")
        devices.ready(dev, f"nonce-{i}")
    return devices


def test_a_round_samples_a_fraction_never_below_the_quorum_alike_on_a_rerun():
    cfg = FLConfig(clients=8, fraction=0.25, min_updates=3, round_timeout=12.0)
    plan = FedAvg().configure_round(4, cfg, _pool(8))
    assert len(plan.devices) == 3  # ceil(0.25 * 8) = 2, raised to the quorum
    assert plan.devices == sorted(plan.devices)
    assert (plan.deadline_s, plan.quorum) == (12.0, 3)
    assert FedAvg().configure_round(4, cfg, _pool(8)) == plan  # seeded by (seed, round)
    every = FLConfig(clients=8, min_updates=3)
    assert FedAvg().configure_round(1, every, _pool(8)).devices == _pool(8).available()


def test_a_late_update_is_weighted_by_its_age():
    now = _u("a", [2, 2], samples=4)
    late = Update("b", 1, now.delta, 4, 4.0)
    FedAvg().aggregate_round(3, FLConfig(staleness=1.0), G, [now], [late], {"w"})
    assert late.weight == pytest.approx(4 * (1 + 3 - 1) ** -1.0)
