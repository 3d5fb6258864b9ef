"""The downlink's XOR delta: exact for every dtype, zero where nothing changed, checked."""

from __future__ import annotations

import numpy as np
import pytest

from tensorwire.fl.compression import apply_xor_delta, xor_delta


def _state(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "w": rng.standard_normal((64, 32)).astype(np.float32),
        "h": rng.standard_normal(100).astype(np.float16),
        "d": rng.standard_normal(7),
        "count": np.array(12, dtype=np.int64),
        "mask": rng.random(9) > 0.5,
    }


def test_xor_delta_round_trips_bit_exact_including_nan_and_signed_zero():
    rng = np.random.default_rng(0)
    old = _state(rng)
    new = {k: v.copy() for k, v in old.items()}
    new["w"][0, :4] = [np.nan, -0.0, np.inf, 1e-45]
    new["w"][5] += 1e-3
    new["count"] = np.array(13, dtype=np.int64)
    new["mask"] = ~new["mask"]
    delta = xor_delta(new, old)
    back = apply_xor_delta(old, delta)
    for k in new:
        assert back[k].dtype == new[k].dtype and back[k].shape == new[k].shape
        assert back[k].tobytes() == new[k].tobytes(), k
    # unchanged entries are zero bits, so a sparse change gives a sparse delta
    assert np.count_nonzero(delta["w"]) == 4 + 32
    assert not delta["h"].any() and not delta["d"].any()


def test_a_delta_that_does_not_fit_the_previous_model_is_refused():
    rng = np.random.default_rng(1)
    old = _state(rng)
    delta = xor_delta(old, old)
    with pytest.raises(ValueError, match="differ in entries"):
        apply_xor_delta(old, {k: v for k, v in delta.items() if k != "d"})
    bad = dict(delta, w=np.zeros((32, 64), np.uint32))
    with pytest.raises(ValueError, match="'w'"):
        apply_xor_delta(old, bad)
    bad = dict(delta, w=np.zeros((64, 32), np.float32))
    with pytest.raises(ValueError, match="expected uint32"):
        apply_xor_delta(old, bad)
    with pytest.raises(ValueError, match="different entries"):
        xor_delta({"w": old["w"]}, old)


def test_a_dropped_update_gives_back_its_error_feedback_memory():
    """A device keeps its compressor's memory before each update and puts it back when the
    server did not apply the update, or asks for the round again: the residual then holds
    only what applied rounds computed and did not send."""
    import tensorwire
    from tensorwire.fl.client import FLDevice
    from tensorwire.fl.compression import feedback_state, uplink_codec
    from tensorwire.fl.config import FLConfig

    rng = np.random.default_rng(2)
    device = FLDevice("device-1")
    device.selector = uplink_codec(FLConfig(uplink="topk", ratio=0.05))
    grads = [{"w": rng.standard_normal(4096).astype(np.float32)} for _ in range(3)]

    def send(g):
        tensorwire.encode({"update": g}, codec=device.selector)
        return device.selector.residual("update/w")

    after_1 = send(grads[0])
    device.pending = (2, feedback_state(device.selector))
    after_2 = send(grads[1])
    assert not np.array_equal(after_1, after_2)
    device.roll_back(3, {"dropped": {"device-1": 2}})  # round 2's update was not applied
    np.testing.assert_array_equal(device.selector.residual("update/w"), after_1)
    assert device.pending is None

    device.pending = (3, feedback_state(device.selector))
    after_3 = send(grads[2])
    device.roll_back(5, {"dropped": {"device-2": 3}})  # applied (someone else's was dropped)
    np.testing.assert_array_equal(device.selector.residual("update/w"), after_3)

    device.pending = (5, feedback_state(device.selector))
    send(grads[0])
    device.roll_back(5, {})  # a restarted server asks for round 5 again
    np.testing.assert_array_equal(device.selector.residual("update/w"), after_3)
