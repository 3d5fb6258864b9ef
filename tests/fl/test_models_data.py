"""The models match FedComm's sizes; the data sets and splits behave."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from tensorwire.fl.data import (  # noqa: E402
    DataNotFound,
    load_cifar10_dataset,
    load_digits_dataset,
    split_indices,
)
from tensorwire.fl.models import build_model, count_parameters  # noqa: E402


@pytest.mark.parametrize(("name", "params"), [("vgg5", 582_346), ("vgg8", 1_337_898)])
def test_fedcomm_parameter_counts(name, params):
    model = build_model(name)
    assert count_parameters(model) == params
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert all(c.kernel_size == (3, 3) and c.padding == (1, 1) for c in convs)
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == len(convs)


def test_digits_is_the_real_offline_data_set_upsampled():
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (extra 'fl')")
    d = load_digits_dataset()
    assert d.train_x.shape[1:] == (3, 32, 32) and d.train_x.dtype == np.float32
    assert len(d.train_x) + len(d.test_x) == 1797
    assert set(np.unique(d.test_y)) == set(range(10))
    np.testing.assert_array_equal(d.train_x[:, 0], d.train_x[:, 2])  # grey, three channels


def test_cifar10_absent_says_where_to_put_it(tmp_path):
    with pytest.raises(DataNotFound, match="cifar-10-batches-py"):
        load_cifar10_dataset(tmp_path)


def test_cifar10_binary_batches_are_read(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        rows = rng.integers(0, 256, (20, 3073), dtype=np.uint8)
        rows[:, 0] %= 10
        rows.tofile(folder / name)
    d = load_cifar10_dataset(tmp_path)
    assert d.train_x.shape == (100, 3, 32, 32) and d.test_x.shape == (20, 3, 32, 32)
    assert d.train_y.max() < 10


@pytest.mark.parametrize("method", ["equal", "iid", "dirichlet"])
def test_splits_cover_every_sample_once(method):
    labels = np.repeat(np.arange(10), 30)
    shards = split_indices(labels, 4, method, alpha=0.3, seed=1)
    joined = np.sort(np.concatenate(shards))
    np.testing.assert_array_equal(joined, np.arange(len(labels)))
    if method == "equal":
        np.testing.assert_array_equal(shards[0], np.arange(75))  # contiguous, FedComm's shards


def test_dirichlet_small_alpha_skews_the_classes():
    labels = np.repeat(np.arange(10), 100)
    shards = split_indices(labels, 4, "dirichlet", alpha=0.05, seed=0)
    dominant = [
        np.bincount(labels[s], minlength=10).max() / max(len(s), 1) for s in shards if len(s)
    ]
    assert max(dominant) > 0.4  # far from the 0.1 of an IID shard
