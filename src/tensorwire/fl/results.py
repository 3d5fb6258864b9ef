"""An FL run's results directory: manifest.json, rounds.parquet, transfers.parquet (no pickle)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tensorwire.fl.server import RunResult


def _version(pkg: str) -> str | None:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def manifest(extra: dict[str, Any]) -> dict[str, Any]:
    """Versions, host and git commit, plus ``extra`` (the config, protocol, URL ...)."""
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {p: _version(p) for p in ("tensorwire", "numpy", "torch", "pyarrow")}
        | {"python": sys.version.split()[0]},
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "node": platform.node()},
        "git_commit": _git_commit(),
        **extra,
    }


def write_run(result: RunResult, out_dir: Path, extra: dict[str, Any]) -> Path:
    """Write the run into ``out_dir`` (created); return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = manifest({"config": result.config.as_dict(), **extra})
    (out_dir / "manifest.json").write_text(json.dumps(doc, indent=2, default=str))
    pq.write_table(pa.Table.from_pylist(result.rounds), out_dir / "rounds.parquet")
    if result.transfers:
        pq.write_table(pa.Table.from_pylist(result.transfers), out_dir / "transfers.parquet")
    return out_dir
