"""Every check an update goes through before aggregation, each with the reason it gives."""

from __future__ import annotations

import numpy as np
import pytest

from tensorwire.fl.errors import UpdateRejected
from tensorwire.fl.validation import check_update

MODEL = {
    "conv.weight": np.zeros((4, 3), np.float32),
    "bn.num_batches_tracked": np.array(0, np.int64),
}


def _good() -> dict[str, np.ndarray]:
    return {
        "conv.weight": np.full((4, 3), 0.5, np.float32),
        "bn.num_batches_tracked": np.array(7, np.int64),
    }


def _check(entries, samples=10, **kw):
    return check_update({"update": entries}, {"samples": samples}, MODEL, max_samples=100, **kw)


def test_a_good_update_is_copied_and_measured():
    entries = _good()
    ok = _check(entries)
    assert ok.samples == 10 and ok.norm == pytest.approx(0.5 * np.sqrt(12))
    entries["conv.weight"][:] = 9  # the transport may reuse the arrays for its next message
    assert ok.delta["conv.weight"].max() == 0.5


@pytest.mark.parametrize(
    ("mutate", "samples", "reason"),
    [
        (lambda e: e, 10**9, "samples 1000000000 is outside 1..100"),
        (lambda e: e, 0, "outside 1..100"),
        (lambda e: e, True, "samples must be an integer"),
        (lambda e: e, 3.5, "samples must be an integer"),
        (lambda e: (e.pop("conv.weight"), e)[1], 10, "missing 'conv.weight'"),
        (lambda e: e.update(extra=np.zeros(1)) or e, 10, "unexpected 'extra'"),
        (
            lambda e: e.update({"conv.weight": np.zeros((3, 4), np.float32)}) or e,
            10,
            "float32[3, 4]",
        ),
        (
            lambda e: e.update({"conv.weight": np.zeros((4, 3), np.float64)}) or e,
            10,
            "float64[4, 3]",
        ),
        (lambda e: e.update({"conv.weight": "junk"}) or e, 10, "is str"),
        (lambda e: e["conv.weight"].__setitem__((0, 0), np.nan) or e, 10, "NaN or infinite"),
        (lambda e: e["conv.weight"].__setitem__((1, 1), np.inf) or e, 10, "NaN or infinite"),
    ],
)
def test_each_bad_update_is_rejected_with_its_reason(mutate, samples, reason):
    with pytest.raises(UpdateRejected, match=reason.replace("[", r"\[").replace("]", r"\]")):
        _check(mutate(_good()), samples)


def test_the_update_must_be_the_one_mapping_it_travels_under():
    with pytest.raises(UpdateRejected, match="one mapping 'update'"):
        check_update({"w": np.zeros(1)}, {"samples": 1}, MODEL, max_samples=10)
    with pytest.raises(UpdateRejected, match="one mapping 'update'"):
        check_update({"update": _good(), "x": np.zeros(1)}, {"samples": 1}, MODEL, max_samples=10)


def test_clipping_scales_the_float_entries_down_to_the_norm():
    entries = _good()
    entries["conv.weight"][:] = 1e3
    ok = _check(entries, clip_norm=1.0)
    assert ok.norm == pytest.approx(1e3 * np.sqrt(12))  # recorded as it came
    assert np.linalg.norm(ok.delta["conv.weight"]) == pytest.approx(1.0, rel=1e-5)
    assert int(ok.delta["bn.num_batches_tracked"]) == 7  # counters are not scaled


def test_the_transports_loss_report_is_kept_per_entry():
    ok = _check(_good(), loss={"update/conv.weight": 0.25, "update/bn.num_batches_tracked": 0.0})
    assert ok.loss == {"conv.weight": 0.25}
