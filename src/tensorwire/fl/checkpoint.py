"""A run's checkpoints: after every round, the global model, the strategy's state and the
server's own (device shards, RNG), so that a stopped run resumes where it was.

``DIR/checkpoints/round-000003/`` holds ``state.json`` and one ``.npy`` file per array
(``numpy.save`` with ``allow_pickle=False``, read back the same way: no pickle anywhere).
A checkpoint is written under a temporary name and renamed when complete, so a process
killed while writing one leaves the previous one intact; the last :data:`KEEP` are kept.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tensorwire.fl.errors import CheckpointError
from tensorwire.fl.train import StateDict

CHECKPOINTS = "checkpoints"
STATE = "state.json"
FORMAT = 1
KEEP = 2


@dataclass
class Checkpoint:
    """The state after ``round``: ``model`` (the global model), ``strategy`` (its JSON state
    and ``strategy_arrays``), ``server`` (JSON: shards, devices still to be told, RNG)."""

    round: int
    config: dict[str, Any]
    model: StateDict
    strategy: dict[str, Any] = field(default_factory=dict)
    strategy_arrays: dict[str, np.ndarray] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)


def _name(round_: int) -> str:
    return f"round-{round_:06d}"


def save_checkpoint(run_dir: Path, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` into ``run_dir/checkpoints`` (atomically); return its directory."""
    root = run_dir / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / _name(ckpt.round)
    tmp = root / f".{_name(ckpt.round)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    index: list[dict[str, Any]] = []
    groups = (("model", ckpt.model), ("strategy", ckpt.strategy_arrays))
    for group, arrays in groups:
        for name, arr in arrays.items():
            file = f"{len(index):05d}.npy"
            a = np.asarray(arr)  # not ascontiguousarray: it makes a 0-d array 1-d
            np.save(tmp / file, a, allow_pickle=False)
            index.append(
                {
                    "group": group,
                    "name": name,
                    "file": file,
                    "dtype": a.dtype.str,
                    "shape": list(a.shape),
                }
            )
    doc = {
        "format": FORMAT,
        "round": ckpt.round,
        "config": ckpt.config,
        "strategy": ckpt.strategy,
        "server": ckpt.server,
        "arrays": index,
    }
    (tmp / STATE).write_text(json.dumps(doc, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in sorted(p for p in root.glob("round-*") if p.is_dir())[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The directory of the newest complete checkpoint in ``run_dir``, or None."""
    root = run_dir / CHECKPOINTS
    done = sorted(p for p in root.glob("round-*") if (p / STATE).is_file())
    return done[-1] if done else None


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """The newest complete checkpoint of ``run_dir``; :class:`CheckpointError` if none or if
    its files do not match what its ``state.json`` says."""
    where = latest_checkpoint(Path(run_dir))
    if where is None:
        raise CheckpointError(
            f"{run_dir} holds no checkpoint ({CHECKPOINTS}/round-*/{STATE}): it is not the "
            "results directory of a run that finished a round"
        )
    try:
        doc = json.loads((where / STATE).read_text())
        if doc.get("format") != FORMAT:
            raise CheckpointError(f"{where}: checkpoint format {doc.get('format')}, not {FORMAT}")
        groups: dict[str, dict[str, np.ndarray]] = {"model": {}, "strategy": {}}
        for item in doc["arrays"]:
            file = where / Path(item["file"]).name  # never a path out of the checkpoint
            arr = np.load(file, allow_pickle=False)
            if arr.dtype.str != item["dtype"] or list(arr.shape) != item["shape"]:
                raise CheckpointError(
                    f"{file} is {arr.dtype}{list(arr.shape)}, its index says "
                    f"{item['dtype']}{item['shape']}"
                )
            groups[item["group"]][item["name"]] = arr
        return Checkpoint(
            round=int(doc["round"]),
            config=doc["config"],
            model=groups["model"],
            strategy=doc.get("strategy", {}),
            strategy_arrays=groups["strategy"],
            server=doc.get("server", {}),
        )
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{where} is not a readable checkpoint: {exc}") from None
