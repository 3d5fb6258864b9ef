"""The message format: the layout (``layout``), its prefix (``prefix``), the header built
(``build``) and parsed (``parse``), the reference layout read by its bytes (``known``) and
the ``tensors`` array validated (``entries``). ``docs/wire-format.md`` is the normative text.
"""

from tensorwire.wire.format.build import assemble_header, build_header
from tensorwire.wire.format.known import known_header, known_meta_bytes, meta_cut
from tensorwire.wire.format.layout import (
    DIGEST_SIZE,
    FLAG_DIGESTS,
    KNOWN_FLAGS,
    MAGIC,
    PREFIX,
    PREFIX_SIZE,
    VERSION,
    Limits,
    MessagePlan,
    TensorSpec,
)
from tensorwire.wire.format.parse import parse_header
from tensorwire.wire.format.prefix import (
    Prefix,
    header_check,
    pack_prefix,
    parse_prefix,
    verify_header,
)

__all__ = [
    "DIGEST_SIZE",
    "FLAG_DIGESTS",
    "KNOWN_FLAGS",
    "MAGIC",
    "PREFIX",
    "PREFIX_SIZE",
    "VERSION",
    "Limits",
    "MessagePlan",
    "Prefix",
    "TensorSpec",
    "assemble_header",
    "build_header",
    "header_check",
    "known_header",
    "known_meta_bytes",
    "meta_cut",
    "pack_prefix",
    "parse_header",
    "parse_prefix",
    "verify_header",
]
