"""resolve_codecs turns every accepted form of ``codec=`` into a selector."""

from __future__ import annotations

import numpy as np
import pytest

from tensorwire.codecs import (
    LZ4,
    NAMED_CODEC_MIN_SIZE,
    AutoCodec,
    Blosc2,
    Codec,
    FixedChainSelector,
    Zlib,
    Zstd,
    resolve_codecs,
)
from tensorwire.errors import CodecConfigError

BIG = np.zeros(1 << 16, dtype=np.float32)
TINY = np.zeros(4, dtype=np.float32)


@pytest.mark.parametrize("spec", [None, "raw", "none", "RAW", [], ()])
def test_raw_specs_never_compress(spec: object) -> None:
    selector = resolve_codecs(spec)
    assert selector("w", BIG) == [] and selector("b", TINY) == []


def test_auto() -> None:
    assert isinstance(resolve_codecs("auto"), AutoCodec)
    auto = AutoCodec(bandwidth=5e6)
    assert resolve_codecs(auto) is auto


@pytest.mark.parametrize(
    "name, codec", [("lz4", LZ4()), ("zstd", Zstd()), ("zlib", Zlib()), ("blosc2", Blosc2())]
)
def test_a_codec_id_compresses_all_but_tiny_tensors(name: str, codec: Codec) -> None:
    selector = resolve_codecs(name)
    just_big_enough = np.zeros(NAMED_CODEC_MIN_SIZE, dtype=np.uint8)
    assert selector("w", just_big_enough) == [codec.for_itemsize(1)]
    assert selector("w", just_big_enough[1:]) == []
    assert selector("b", TINY) == []


def test_named_blosc2_learns_the_itemsize() -> None:
    assert resolve_codecs("blosc2")("w", BIG) == [Blosc2(typesize=4)]


def test_codec_instances_and_chains_apply_to_every_tensor() -> None:
    assert resolve_codecs(Zstd(level=9))("b", TINY) == [Zstd(level=9)]
    chain = [Blosc2(filter="bitshuffle"), Zstd(level=2)]
    assert resolve_codecs(chain)("w", BIG) == [Blosc2(filter="bitshuffle", typesize=4), Zstd(2)]
    assert isinstance(resolve_codecs(chain), FixedChainSelector)


def test_callables_are_used_as_they_are() -> None:
    def selector(name: str, array: np.ndarray) -> list[LZ4]:
        return [LZ4()] if name.startswith("conv") else []

    assert resolve_codecs(selector) is selector


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(CodecConfigError, match=r"'snappy'.*raw, none, auto.*blosc2.*lz4"):
        resolve_codecs("snappy")


@pytest.mark.parametrize("spec", [5, 1.5, {"id": "lz4"}, [LZ4(), "zstd"], b"lz4"])
def test_other_specs_are_refused(spec: object) -> None:
    with pytest.raises(CodecConfigError, match="codec="):
        resolve_codecs(spec)


def test_lossy_names_resolve_to_their_selector():
    import numpy as np

    from tensorwire.codecs import LossySelector

    selector = resolve_codecs("topk")
    chain = selector("w", np.ones(100_000, np.float32))
    assert chain and chain[0].get_config()["id"] == "topk"
    assert isinstance(resolve_codecs("fp16"), LossySelector)
