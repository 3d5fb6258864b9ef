"""The registry rebuilds codecs from header configs and treats bad configs as bad data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorwire.codecs import (
    LZ4,
    Codec,
    Zstd,
    available_codecs,
    get_codec,
    register_codec,
)
from tensorwire.codecs.abc import DEFAULT_MAX_DECODED_SIZE
from tensorwire.codecs.registry import _codecs
from tensorwire.errors import CodecConfigError, CodecDataError, UnknownCodec


def test_available_codecs_lists_every_builtin() -> None:
    assert available_codecs() == sorted(available_codecs())
    assert {"lz4", "zstd", "zlib", "blosc2", "lzma"} <= set(available_codecs())


def test_get_codec_rebuilds_with_parameters() -> None:
    assert get_codec({"id": "zstd", "level": 7}) == Zstd(level=7)
    assert get_codec({"id": "lz4"}) == LZ4()


def test_unknown_id_lists_the_known_ones() -> None:
    with pytest.raises(UnknownCodec, match=r"'snappy'.*blosc2.*lz4.*lzma.*zlib.*zstd"):
        get_codec({"id": "snappy"})


@pytest.mark.parametrize(
    "config",
    [
        {"id": "zstd", "level": 99},
        {"id": "zstd", "level": "3"},
        {"id": "zstd", "level": True},
        {"id": "zstd", "level": 2**70},
        {"id": "zstd", "levle": 3},
        {"id": "lz4", "block_size": 12},
        {"id": "lz4", "block_size": 1 << 40},
        {"id": "blosc2", "cname": "snappy"},
        {"id": "blosc2", "filter": ["shuffle"]},
        {"id": "blosc2", "typesize": 0},
        {"id": "blosc2", "nthreads": 4},
        {"id": "lzma", "preset": -1},
        {"id": "zlib", 1: 2},
    ],
)
def test_bad_parameters_from_a_header_are_corrupt_data(config: dict[Any, Any]) -> None:
    with pytest.raises(CodecDataError, match="invalid config"):
        get_codec(config)


@pytest.mark.parametrize("config", [None, [], "lz4", {"level": 3}, {"id": 5}, {"id": None}])
def test_configs_without_an_id_string_are_corrupt_data(config: Any) -> None:
    with pytest.raises(CodecDataError):
        get_codec(config)


def test_messages_do_not_echo_huge_values() -> None:
    with pytest.raises(UnknownCodec) as unknown:
        get_codec({"id": "x" * 100_000})
    assert len(str(unknown.value)) < 300
    with pytest.raises(CodecDataError) as bad:
        get_codec({"id": "zstd", "level": "y" * 100_000})
    assert len(str(bad.value)) < 500


def test_bad_parameters_at_construction_raise_config_errors() -> None:
    with pytest.raises(CodecConfigError, match="level"):
        Zstd(level=23)
    with pytest.raises(CodecConfigError, match="acceleration"):
        LZ4(acceleration=0)
    with pytest.raises(CodecConfigError, match="not 'lz4'"):
        LZ4.from_config({"id": "zstd"})


class Reverse(Codec):
    """A toy codec: the bytes reversed."""

    codec_id = "test-reverse"

    def encode(self, buf: Any) -> bytes:
        return bytes(memoryview(buf).cast("B"))[::-1]

    def decode(self, buf: Any, out: Any = None, *, max_size: int = DEFAULT_MAX_DECODED_SIZE) -> Any:
        data = np.frombuffer(bytes(buf)[::-1], np.uint8)
        if out is None:
            return data.copy()
        memoryview(out).cast("B")[:] = data
        return out


def test_register_codec_adds_a_decodable_id() -> None:
    assert register_codec(Reverse) is Reverse
    try:
        assert "test-reverse" in available_codecs()
        codec = get_codec({"id": "test-reverse"})
        assert codec == Reverse()
        assert bytes(codec.decode(codec.encode(b"abc"))) == b"abc"
        with pytest.raises(CodecDataError, match="invalid config"):
            get_codec({"id": "test-reverse", "extra": 1})
    finally:
        del _codecs["test-reverse"]


def test_register_codec_needs_an_id() -> None:
    class Nameless(Reverse):
        codec_id = ""

    with pytest.raises(CodecConfigError, match="codec_id"):
        register_codec(Nameless)
