"""Checkpoints: written whole or not at all, read back exactly, never unpickled, refused
when their files do not match their index."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tensorwire.fl.checkpoint import (
    CHECKPOINTS,
    KEEP,
    Checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from tensorwire.fl.errors import CheckpointError


def _ckpt(r: int) -> Checkpoint:
    rng = np.random.default_rng(r)
    return Checkpoint(
        round=r,
        config={"rounds": 5, "seed": 3},
        model={
            "a.weight": rng.standard_normal((3, 2)).astype(np.float32),
            "bn.num_batches_tracked": np.array(r, np.int64),
            "h": rng.standard_normal(4).astype(np.float16),
        },
        strategy={"name": "fedadam", "state": {"steps": r}},
        strategy_arrays={"m/a.weight": np.full((3, 2), 0.5)},
        server={"shards": {"device-1": 0}, "torch_rng": "00ff"},
    )


def test_the_newest_checkpoint_reads_back_bit_exact_and_old_ones_are_pruned(tmp_path):
    for r in range(1, 5):
        save_checkpoint(tmp_path, _ckpt(r))
    kept = sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir())
    assert kept == [f"round-{r:06d}" for r in range(5 - KEEP, 5)]
    back = load_checkpoint(tmp_path)
    want = _ckpt(4)
    assert back.round == 4 and back.config == want.config and back.server == want.server
    assert back.strategy == want.strategy
    for k, v in want.model.items():
        assert back.model[k].dtype == v.dtype and back.model[k].shape == v.shape, k
        assert back.model[k].tobytes() == v.tobytes()
    np.testing.assert_array_equal(back.strategy_arrays["m/a.weight"], 0.5)


def test_a_checkpoint_cut_short_is_not_taken(tmp_path):
    save_checkpoint(tmp_path, _ckpt(1))
    half = tmp_path / CHECKPOINTS / ".round-000002.tmp-1"  # a writer killed mid-way
    half.mkdir()
    (half / "00000.npy").write_bytes(b"\x93NUMPY")
    undone = tmp_path / CHECKPOINTS / "round-000003"  # no state.json: not complete
    undone.mkdir()
    assert latest_checkpoint(tmp_path).name == "round-000001"
    assert load_checkpoint(tmp_path).round == 1


def test_no_checkpoint_says_so(tmp_path):
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        load_checkpoint(tmp_path)


def test_a_tampered_checkpoint_is_refused_not_unpickled(tmp_path):
    where = save_checkpoint(tmp_path, _ckpt(1))
    # an object array (a pickle inside the .npy) in place of the first array
    np.save(where / "00000.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path)
    where = save_checkpoint(tmp_path, _ckpt(2))
    np.save(where / "00000.npy", np.zeros((2, 2), np.float32))  # shape differs from the index
    with pytest.raises(CheckpointError, match="its index says"):
        load_checkpoint(tmp_path)
    where = save_checkpoint(tmp_path, _ckpt(3))
    doc = json.loads((where / "state.json").read_text())
    doc["arrays"][0]["file"] = "../../../etc/passwd"  # a path out of the checkpoint
    (where / "state.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path)
