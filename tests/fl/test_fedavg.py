"""FedAvg on known numbers, and the update arithmetic around it."""

import numpy as np
import pytest

from tensorwire.fl.fedavg import apply_update, fedavg, model_update


def test_weighted_mean_is_exact_on_a_toy_model():
    a = {"w": np.array([1.0, 2.0], np.float32), "n": np.array(10, np.int64)}
    b = {"w": np.array([5.0, -2.0], np.float32), "n": np.array(13, np.int64)}
    avg = fedavg([a, b], [1, 3])
    np.testing.assert_array_equal(avg["w"], np.array([4.0, -1.0], np.float32))
    assert avg["w"].dtype == np.float32
    assert avg["n"].dtype == np.int64 and int(avg["n"]) == 12  # (10 + 39) / 4 = 12.25 -> 12


def test_equal_weights_give_the_plain_mean_and_bad_weights_are_refused():
    states = [{"w": np.full(3, float(i))} for i in range(4)]
    np.testing.assert_allclose(fedavg(states, [7] * 4)["w"], np.full(3, 1.5))
    with pytest.raises(ValueError):
        fedavg(states, [0, 0, 0, 0])
    with pytest.raises(ValueError):
        fedavg(states, [1, 1])
    with pytest.raises(ValueError):
        fedavg([{"w": np.zeros(1)}, {"v": np.zeros(1)}], [1, 1])


def test_update_round_trip():
    g = {"w": np.arange(4, dtype=np.float32), "n": np.array(3)}
    local = {"w": g["w"] * 2, "n": np.array(5)}
    delta = model_update(local, g)
    np.testing.assert_array_equal(delta["w"], g["w"])
    assert int(delta["n"]) == 5  # counters travel as values
    back = apply_update(g, delta)
    np.testing.assert_array_equal(back["w"], local["w"])
    assert int(back["n"]) == 5
