"""A Dask scheduler and two workers on tensorwire+tcp:// compute real workloads correctly."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

import dask.array as da
from distributed import Client, LocalCluster
from distributed.comm import registry

from tensorwire.integrations.dask import TensorwireBackend


def test_entry_point_names_the_backend(tw_backend: str) -> None:
    registry.backends.pop(tw_backend, None)
    assert isinstance(registry.get_backend(tw_backend), TensorwireBackend)


def _rechunk_sum(client: Client) -> None:
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((2000, 2000)).astype(np.float32)
    x = da.from_array(x_np, chunks=(2000, 250))
    y = x.rechunk((250, 2000)) * 2 + 1  # every output chunk needs a piece of every input
    got = client.compute(y.sum(axis=0)).result(timeout=120)
    np.testing.assert_allclose(got, (x_np * 2 + 1).sum(axis=0), rtol=1e-4)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_cluster_computes_a_rechunk_over_tensorwire(tw_backend: str, processes: bool) -> None:
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=processes,
            protocol=tw_backend + "://",
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        assert cluster.scheduler_address.startswith(tw_backend + "://127.0.0.1:")
        workers = client.scheduler_info()["workers"]
        assert len(workers) == 2
        assert all(addr.startswith(tw_backend + "://127.0.0.1:") for addr in workers)
        _rechunk_sum(client)
        # data really moved worker to worker (each output chunk needs the other's pieces)
        moved = client.run(
            lambda dask_worker: sum(t["total"] for t in dask_worker.transfer_incoming_log)
        )
        assert sum(moved.values()) > 4_000_000  # over a quarter of the 16 MB array
