"""The tensorwire Dask backend, found by a real entry point as Dask looks it up.

``scripts/setup.sh`` installs tensorwire with its entry points. Where the installed metadata
is older than this checkout's pyproject.toml (installed before the backend existed), a
throwaway ``*.dist-info`` holding only ``entry_points.txt`` is put on ``sys.path`` and
``PYTHONPATH`` (so worker processes find it too), and Dask's registry looks the scheme up
through ``importlib.metadata`` as it would for an installed package.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

SCHEME = "tensorwire+tcp"


def entry_points_text() -> str:
    """The ``distributed.comm.backends`` table of this checkout's pyproject.toml."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    table = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]
    group = table["distributed.comm.backends"]
    lines = ["[distributed.comm.backends]", *(f"{k} = {v}" for k, v in group.items())]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def tw_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from importlib.metadata import entry_points

    from distributed.comm import registry

    registry.backends.pop(SCHEME, None)
    if entry_points(group="distributed.comm.backends", name=SCHEME):
        yield SCHEME  # installed: nothing to add
        return
    site = tmp_path_factory.mktemp("ep")
    info = site / "tensorwire_dask_ep-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorwire-dask-ep\nVersion: 0\n")
    (info / "entry_points.txt").write_text(entry_points_text())
    sys.path.append(str(site))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (old, str(site)) if p)
    registry.backends.pop(SCHEME, None)
    try:
        yield SCHEME
    finally:
        sys.path.remove(str(site))
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
