"""tensorwire as a Dask comm backend (``tensorwire+tcp://``), registered by entry point.

Needs the ``dask`` extra (``pip install tensorwire[dask]``). See ``docs/dask.md``.
"""

from tensorwire.integrations.dask.backend import (
    SCHEME,
    TensorwireBackend,
    TensorwireConnector,
    TensorwireListener,
)
from tensorwire.integrations.dask.comm import TensorwireComm

__all__ = [
    "SCHEME",
    "TensorwireBackend",
    "TensorwireComm",
    "TensorwireConnector",
    "TensorwireListener",
]
