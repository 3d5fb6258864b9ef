"""Which codecs an FL run's uplink and downlink use, from its config."""

from __future__ import annotations

from typing import Any

from tensorwire.fl.config import FLConfig

SPARSIFIERS = ("topk", "randomk", "dgc")  # the compressors that take a kept fraction


def uplink_codec(cfg: FLConfig) -> Any:
    """The device's codec selector for its updates (None: raw)."""
    if cfg.uplink == "none":
        return None
    from tensorwire.codecs import lossy_selector

    params = {"ratio": cfg.ratio} if cfg.uplink in SPARSIFIERS else {}
    # error feedback on: each compressor's own default (on where it is biased); off: off
    feedback = None if cfg.error_feedback else False
    return lossy_selector(cfg.uplink, error_feedback=feedback, **params)


def downlink_codec(cfg: FLConfig) -> Any:
    """The server's codec selector for the global model (None: raw; "delta" is sent raw)."""
    if cfg.downlink != "fp16":
        return None
    from tensorwire.codecs import lossy_selector

    return lossy_selector("fp16", error_feedback=False)
