"""Lossy tensor compressors (the GRACE family) and error-feedback selectors.

Each compressor is a codec made for one float dtype (its ``dtype`` parameter): ``fp16`` and
``bf16`` (casts), ``int8`` (per-block scale), ``qsgd`` (unbiased stochastic levels),
``topk``, ``randomk`` and ``dgc`` (sparsification), ``signsgd`` (1 bit per element). Its
config travels in the message header like any codec's, so a receiver decodes with
:func:`tensorwire.codecs.get_codec` and no state. Payload layouts are in each module's
docstring.

Senders pick them with a selector: :func:`lossy_selector` by name, :class:`ErrorFeedback`
(residual carried to the next round, optional DGC momentum correction) or
:class:`LossySelector` (none), all of which send small and non-float tensors raw.
"""

from tensorwire.codecs.lossy.base import FLOAT_DTYPES, LOSSY_MIN_SIZE, LossyCodec
from tensorwire.codecs.lossy.cast import BF16, FP16
from tensorwire.codecs.lossy.dgc import DGC
from tensorwire.codecs.lossy.feedback import ErrorFeedback, FeedbackCodec
from tensorwire.codecs.lossy.int8 import Int8
from tensorwire.codecs.lossy.qsgd import QSGD
from tensorwire.codecs.lossy.randomk import RandomK
from tensorwire.codecs.lossy.selector import (
    FEEDBACK_BY_DEFAULT,
    LOSSY_CODECS,
    LossySelector,
    lossy_selector,
)
from tensorwire.codecs.lossy.signsgd import SignSGD
from tensorwire.codecs.lossy.topk import TopK

__all__ = [
    "BF16",
    "DGC",
    "FEEDBACK_BY_DEFAULT",
    "FLOAT_DTYPES",
    "FP16",
    "LOSSY_CODECS",
    "LOSSY_MIN_SIZE",
    "QSGD",
    "ErrorFeedback",
    "FeedbackCodec",
    "Int8",
    "LossyCodec",
    "LossySelector",
    "RandomK",
    "SignSGD",
    "TopK",
    "lossy_selector",
]
