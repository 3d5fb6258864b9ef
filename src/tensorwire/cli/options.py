"""Parsing the command's option values: lists, shapes, numbers, link profiles, transports, and
the results directory."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from tensorwire.cli.console import err_console
from tensorwire.errors import UnknownScheme
from tensorwire.transports.registry import find_transport, get_transport
from tensorwire.transports.registry import listed_transports as registered_transports


def results_dir(out: Path | None, name: str) -> Path:
    return out or Path("results") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a shape like 1000x1000") from None


def transport_names() -> list[str]:
    """Every registered transport's name (``zmq`` for zmq+tcp)."""
    return [entry.name for entry in registered_transports()]


def transports_option(text: str) -> list[str]:
    """``--transports``: 'all', or names / schemes of registered transports."""
    if text == "all":
        return transport_names()
    try:
        return [get_transport(t).name for t in split_list(text)]
    except UnknownScheme as exc:
        raise typer.BadParameter(str(exc)) from None


def protocol_option(text: str) -> str:
    """``--protocol`` of ``fl run``: a transport whose devices can be other processes, by
    name or scheme; a usage error listing them for anything else (before anything starts)."""
    entry = find_transport(text)
    listed = registered_transports()
    if entry is None or entry.name not in {e.name for e in listed}:
        names = ", ".join(e.name for e in listed)
        raise typer.BadParameter(
            f"no transport {text!r} for devices in processes; choose among {names}"
        )
    return text


def protocols_help() -> str:
    """``bench fl --protocols``'s help, from the registry: what runs across the testbed's
    links, and what 'all' holds that is skipped (same-host transports)."""
    across = [p for e in registered_transports() if not e.same_host_only for p in e.protocols]
    skipped = [e.name for e in registered_transports() if e.same_host_only]
    also = (
        f"; {', '.join(skipped)} {'is' if len(skipped) == 1 else 'are'} skipped" if skipped else ""
    )
    return (
        f"Comma-separated: {' '.join(across)}, or 'all' (every registered transport{also}). "
        "Default: all."
    )


def split_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def split_profiles(text: str) -> tuple[str, ...]:
    """``--profiles``: comma-separated like every list; a custom profile's ``key=value``
    settings stay with it (``3g,20mbit,delay=30ms`` is ``3g`` and ``20mbit,delay=30ms``).
    The ``;`` separator of tensorwire 0.1 still works, with a note that it is deprecated."""
    if ";" in text:
        err_console.print(
            "note: ';' between --profiles is deprecated; separate them with ',' like every "
            "other list (a profile's key=value settings stay with it)"
        )
        return tuple(p.strip() for p in text.split(";") if p.strip())
    profiles: list[list[str]] = []
    for token in split_list(text):
        if "=" in token and profiles:
            profiles[-1].append(token)
        else:
            profiles.append([token])
    return tuple(",".join(p) for p in profiles)


def parse_floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in split_list(text))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a list of numbers like 0,0.05,0.1") from None
