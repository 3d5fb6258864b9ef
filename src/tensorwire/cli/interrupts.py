"""What a command says when Ctrl-C stops an FL run: that it was interrupted, after which
round, where its results are and how to go on (the server's manifest records the same as its
``outcome``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tensorwire.cli.console import console

if TYPE_CHECKING:
    from tensorwire.fl.config import FLConfig

INTERRUPTED = 130  # the exit status of a command stopped by SIGINT, as shells report it


@contextmanager
def interrupted_run(
    command: str, out: Path, done: list[int], rounds: int, again: str = ""
) -> Iterator[None]:
    """Turn Ctrl-C into three lines (what happened, where the results are, how to resume)
    and exit 130. ``done[0]`` is the last round finished, kept up to date by the caller; a
    checkpoint written before Ctrl-C reached the caller's callback counts too (it is what
    ``--resume`` goes on from)."""
    try:
        yield
    except KeyboardInterrupt:
        last = max(done[0], _checkpointed(out))
        console.print(f"[yellow]interrupted[/] after round {last} of {rounds} (Ctrl-C)")
        if last == 0:
            console.print(f"no round finished, so there is nothing to resume; logs: {out}")
        else:
            console.print(f"results so far: {out} (manifest.json says it was interrupted)")
            resume = f"tensorwire {command} --resume {out}"
            console.print(f"go on with: {resume}{' ' + again if again else ''}")
        raise typer.Exit(INTERRUPTED) from None


def _checkpointed(out: Path) -> int:
    """The round of the newest complete checkpoint in ``out`` (0 if none can be read)."""
    from tensorwire.fl.checkpoint import STATE, latest_checkpoint

    where = latest_checkpoint(out)
    if where is None:
        return 0
    try:
        return int(json.loads((where / STATE).read_text())["round"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def resumed_run(run_dir: Path) -> tuple[FLConfig, str, Path | None]:
    """What ``fl run --resume DIR`` goes on with: the checkpoint's settings, the protocol the
    run used (from its manifest's URL) and its certificates (``DIR/certs``, if it was secured).
    A directory that holds no checkpoint is a usage error."""
    from tensorwire.fl.checkpoint import load_checkpoint
    from tensorwire.fl.config import FLConfig
    from tensorwire.fl.errors import CheckpointError

    try:
        saved = load_checkpoint(run_dir)
    except CheckpointError as exc:
        raise typer.BadParameter(str(exc), param_hint="--resume") from None
    try:
        url = json.loads((run_dir / "manifest.json").read_text())["url"]
    except (OSError, ValueError, KeyError):
        raise typer.BadParameter(
            f"{run_dir}/manifest.json does not say which URL the run served", param_hint="--resume"
        ) from None
    certs = run_dir / "certs"
    return (
        FLConfig.from_dict(saved.config),
        str(url).split("://", 1)[0],
        certs if certs.is_dir() else None,
    )
