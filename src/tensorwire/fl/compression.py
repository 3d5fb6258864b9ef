"""Which codecs an FL run's uplink and downlink use, from its config."""

from __future__ import annotations

from typing import Any

from tensorwire.fl.config import FLConfig


def uplink_codec(cfg: FLConfig) -> Any:
    """The device's codec selector for its updates (None: raw)."""
    if cfg.uplink == "none":
        return None
    from tensorwire.codecs import lossy_selector

    return lossy_selector(cfg.uplink, ratio=cfg.ratio, error_feedback=cfg.error_feedback)


def downlink_codec(cfg: FLConfig) -> Any:
    """The server's codec selector for the global model (None: raw; "delta" is sent raw)."""
    if cfg.downlink != "fp16":
        return None
    from tensorwire.codecs import lossy_selector

    return lossy_selector("fp16", error_feedback=False)
