"""Dask's own comm test suite (``distributed/comm/tests/test_comms.py``) run on tensorwire+tcp.

The suite's scheme-generic checks (``check_client_server``, ``check_comm_closed_*``,
``check_deserialize*``, ...) take an address; they are loaded from the file Dask ships and
called with a ``tensorwire+tcp://127.0.0.1`` address. distributed's wheels do not ship their
tests: point ``TW_DASK_COMM_TESTS`` at ``distributed/comm/tests/test_comms.py`` of a checkout
of the installed version, or the tests skip saying so. What does not apply: docs/dask.md.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

distributed = pytest.importorskip("distributed", reason="the dask extra is not installed")

from distributed import utils_test  # noqa: E402
from distributed.utils_test import gen_test  # noqa: E402

ADDR = "tensorwire+tcp://127.0.0.1"


def _suite() -> ModuleType:
    shipped = Path(distributed.__file__).parent / "comm" / "tests" / "test_comms.py"
    path = Path(os.environ.get("TW_DASK_COMM_TESTS", shipped))
    if not path.is_file():
        pytest.skip(
            f"Dask's comm tests not found at {path}: distributed's wheel does not ship them; "
            "set TW_DASK_COMM_TESTS to distributed/comm/tests/test_comms.py of a checkout"
        )
    certs = path.parents[2] / "tests"  # the checkout's test certificates (module-level TLS args)
    if not (certs / "tls-ca-cert.pem").is_file():
        pytest.skip(f"Dask's test certificates not found in {certs} (the suite loads them)")
    utils_test.certs_dir = str(certs)
    spec = importlib.util.spec_from_file_location("dask_test_comms", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def suite(tw_backend: str) -> ModuleType:
    return _suite()


def test_dask_client_server(suite: ModuleType) -> None:
    @gen_test()
    async def run() -> None:
        await suite.check_client_server(ADDR, suite.tcp_eq("127.0.0.1"))
        await suite.check_client_server(ADDR + ":0", suite.tcp_eq("127.0.0.1"))

    run()


def test_dask_comm_closed_implicit(suite: ModuleType) -> None:
    suite.check_comm_closed_implicit(ADDR)  # decorated with gen_test in Dask's file


def test_dask_comm_closed_explicit(suite: ModuleType) -> None:
    gen_test()(suite.check_comm_closed_explicit)(ADDR)


def test_dask_connect_timeout_to_nobody(suite: ModuleType) -> None:
    gen_test()(suite.check_connect_timeout)(ADDR + ":44444")


def test_dask_many_listeners(suite: ModuleType) -> None:
    gen_test()(suite.check_many_listeners)(ADDR)


def test_dask_deserialize(suite: ModuleType) -> None:
    gen_test()(suite.check_deserialize)(ADDR)


def test_dask_deserialize_roundtrip(suite: ModuleType) -> None:
    gen_test()(suite.check_deserialize_roundtrip)(ADDR)


def test_dask_deserialize_eoferror_closes_the_comm(suite: ModuleType) -> None:
    gen_test()(suite.check_deserialize_eoferror)(ADDR)


def test_dask_repr_and_addresses(suite: ModuleType) -> None:
    @gen_test()
    async def run() -> None:
        a, b = await suite.get_comm_pair(ADDR)
        assert a.local_address in repr(b) and b.local_address in repr(a)
        await suite.check_repr(a, b)
        a, b = await suite.get_comm_pair(ADDR)
        await suite.check_addresses(a, b)

    run()


def test_dask_read_cancelled_by_timeout_closes_the_comm(suite: ModuleType) -> None:
    # Dask's test_comm_closed_on_read_error, on a tensorwire pair
    import asyncio

    @gen_test()
    async def run() -> None:
        reader, writer = await suite.get_comm_pair(ADDR)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.read(), 0.01)
        assert reader.closed()
        await reader.close()
        await writer.close()

    run()
