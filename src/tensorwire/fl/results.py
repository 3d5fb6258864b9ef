"""An FL run's results directory, written as the run goes (no pickle anywhere):

``manifest.json`` (config, versions, host, git commit), ``rounds.parquet``,
``transfers.parquet``, ``updates.parquet`` (a row per device and round: applied, late,
rejected ... and why), ``events.parquet`` (devices joining, leaving, refused ...) and
``checkpoints/`` (see :mod:`tensorwire.fl.checkpoint`). The tables are rewritten after every
round under a temporary name and renamed, so a killed server leaves every finished round.
"""

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

from tensorwire.fl.config import FLConfig
from tensorwire.fl.records import RunResult

MANIFEST = "manifest.json"
TABLES = ("rounds", "transfers", "updates", "events")


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


def _replace_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, path)


class RunDirectory:
    """The results directory of one run, kept up to date round by round."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def start(self, config: FLConfig, extra: dict[str, Any], resumed_from: int = 0) -> None:
        """Write the manifest; a resumed run keeps the first one and notes the resumption."""
        self.path.mkdir(parents=True, exist_ok=True)
        path = self.path / MANIFEST
        if resumed_from and path.is_file():
            doc = json.loads(path.read_text())
            doc.setdefault("resumed", []).append(
                {"after_round": resumed_from, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
            )
        else:
            doc = manifest({"config": config.as_dict(), **extra})
        _replace_json(path, doc)

    def save(self, result: RunResult) -> None:
        """Rewrite the tables from ``result`` (each atomically)."""
        for name in TABLES:
            rows = getattr(result, name)
            if not rows:
                continue
            final = self.path / f"{name}.parquet"
            tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
            pq.write_table(pa.Table.from_pylist(rows), tmp)
            os.replace(tmp, final)

    def finish(self, result: RunResult, extra: dict[str, Any]) -> None:
        """Save the tables and add ``extra`` (seconds, outcome ...) to the manifest."""
        self.save(result)
        path = self.path / MANIFEST
        doc = json.loads(path.read_text()) if path.is_file() else manifest({})
        doc.update(extra)
        _replace_json(path, doc)

    def load(self, config: FLConfig) -> RunResult:
        """The tables written so far, as a :class:`RunResult` (for a resumed run)."""
        result = RunResult(config)
        for name in TABLES:
            path = self.path / f"{name}.parquet"
            if path.is_file():
                setattr(result, name, pq.read_table(path).to_pylist())
        return result
