"""How an FL run's uplink and downlink are compressed, from its config.

Uplink: a lossy compressor (with error feedback where it is biased) on the devices' updates,
else the run's lossless ``codec`` (``auto`` by default: each tensor raw or compressed,
whichever the link, as measured by the sends so far, carries faster).
Downlink: the global model with the lossless ``codec``, cast to fp16, or ``delta``: each
entry's bits XOR those of the previous round's global model, then zstd. The XOR is exact for
every dtype (no float rounding between the server's model and the devices' copies) and is
zero wherever a weight did not change, so after a sparse uplink (top-k) the downlink shrinks
with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorwire.fl.config import FLConfig

SPARSIFIERS = ("topk", "randomk", "dgc")  # the compressors that take a kept fraction

StateDict = dict[str, np.ndarray]


def lossless_codec(name: str) -> Any:
    """The codec selector a lossless ``codec`` name asks for (None: raw). ``auto`` is a new
    :class:`~tensorwire.codecs.AutoCodec`: keep it, so that it keeps what it learnt of the
    link."""
    if name == "none":
        return None
    from tensorwire.codecs import resolve_codecs

    return resolve_codecs(name)


def uplink_codec(cfg: FLConfig) -> Any:
    """The device's codec selector for its updates: the lossy compressor, else the lossless
    codec (None: raw)."""
    if cfg.uplink == "none":
        return lossless_codec(cfg.codec)
    from tensorwire.codecs import lossy_selector

    params: dict[str, Any] = {"ratio": cfg.ratio} if cfg.uplink in SPARSIFIERS else {}
    # error feedback on: each compressor's own default (on where it is biased); off: off
    feedback = None if cfg.error_feedback else False
    return lossy_selector(cfg.uplink, error_feedback=feedback, **params)


def feedback_state(selector: Any) -> Any:
    """A copy of an error-feedback selector's memory (residuals, momenta, compressors' random
    streams), or None for a selector without one.

    A device takes it before sending an update and puts it back with
    :func:`restore_feedback` when the server did not apply that update (late, rejected, a
    round without quorum, a resumed server asking for the round again): the residual then
    holds what was computed in applied rounds and not yet delivered, as error feedback
    assumes.
    """
    from tensorwire.codecs.lossy.feedback import ErrorFeedback

    if not isinstance(selector, ErrorFeedback):
        return None
    return selector.snapshot()


def restore_feedback(selector: Any, state: Any) -> None:
    """Put back what :func:`feedback_state` took."""
    if state is None:
        return
    selector.restore(state)


def downlink_codec(cfg: FLConfig) -> Any:
    """The server's codec for the global model: the lossless codec (None: raw), fp16, or
    zstd for ``delta``."""
    if cfg.downlink == "delta":
        from tensorwire.codecs.zstd import Zstd

        return Zstd(level=1)
    if cfg.downlink != "fp16":
        return lossless_codec(cfg.codec)
    from tensorwire.codecs import lossy_selector

    return lossy_selector("fp16", error_feedback=False)


def _bits(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes as unsigned integers of its item size (contiguous)."""
    c = a if a.flags.c_contiguous else a.copy()  # not ascontiguousarray: keeps 0-d arrays 0-d
    return c.view(f"u{a.dtype.itemsize}")


def xor_delta(state: StateDict, previous: StateDict) -> StateDict:
    """Each entry's bits XOR the previous entry's (unsigned ints; zero where unchanged)."""
    if state.keys() != previous.keys():
        raise ValueError("xor_delta: the two states hold different entries")
    return {k: _bits(v) ^ _bits(previous[k]) for k, v in state.items()}


def apply_xor_delta(previous: StateDict, delta: StateDict) -> StateDict:
    """Undo :func:`xor_delta`: the state whose delta from ``previous`` is ``delta``, bit-exact.

    Raises ValueError when the delta does not match ``previous`` entry for entry.
    """
    if delta.keys() != previous.keys():
        missing = sorted(previous.keys() ^ delta.keys())
        raise ValueError(f"delta and previous model differ in entries: {missing[:5]}")
    out: StateDict = {}
    for k, old in previous.items():
        d = np.asarray(delta[k])
        want = np.dtype(f"u{old.dtype.itemsize}").name
        if d.shape != old.shape or d.dtype != want:
            raise ValueError(
                f"delta entry {k!r} is {d.dtype}{list(d.shape)}, expected {want}{list(old.shape)}"
            )
        out[k] = (_bits(old) ^ d).view(old.dtype)
    return out
