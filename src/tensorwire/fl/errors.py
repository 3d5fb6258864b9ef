"""The errors of a federated run: each names the device and says what to do."""

from __future__ import annotations

from tensorwire.errors import TensorwireError


class FLError(TensorwireError, RuntimeError):
    """A federated run could not go on (too few devices, a bad setting, a model that differs)."""


class QuorumLost(FLError):
    """Fewer devices than the quorum are available; ``missing`` maps each device that is not to
    why (left, failed, busy since a round, never joined)."""

    def __init__(self, message: str, missing: dict[str, str]) -> None:
        super().__init__(message)
        self.missing = missing


class ModelMismatch(FLError):
    """A device's model and the server's differ in entries, shapes or dtypes."""


class UpdateRejected(FLError):
    """An update failed validation; ``reason`` says which check (the device is told it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CheckpointError(FLError):
    """A run directory holds no usable checkpoint, or one that does not fit the run."""


class EngineError(FLError):
    """An engine could not place the devices: no cluster at the address, too few nodes."""
