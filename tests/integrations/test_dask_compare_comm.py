"""compare_comm runs one comm per protocol between two processes and prints every measure."""

from __future__ import annotations

import pytest

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

from tensorwire.integrations.dask import compare_comm


def test_compare_comm_prints_medians_for_each_protocol(
    tw_backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    compare_comm.main(["--messages", "2", "--frames", "2", "--frame-mib", "1", "--trials", "1"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if line[:1] != " "}
    assert set(rows) == {"tcp", "tensorwire+tcp"}
    for values in rows.values():
        assert len(values) == len(compare_comm.KEYS) and float(values[0]) > 0  # wall seconds
