"""torch tensors and whole state_dicts go through the wire format unchanged."""

from __future__ import annotations

import random

import ml_dtypes
import numpy as np
import pytest
from wire_helpers import drain, feed_pieces, lookup, zlib_chain

from tensorwire.wire import WIRE_DTYPES, MessageStream, decode_message, encode_message

torch = pytest.importorskip("torch", reason="torch is not installed (the 'fl' extra)")


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 10),
    )
    model.train()
    model(torch.randn(2, 3, 8, 8))  # move the BatchNorm running stats off their defaults
    return model


@pytest.mark.parametrize("codecs", [None, zlib_chain])
def test_state_dict_roundtrip_and_load(codecs: object) -> None:
    model = small_model()
    sd = model.state_dict()
    assert (
        sd["1.num_batches_tracked"].dtype == torch.int64 and sd["1.num_batches_tracked"].dim() == 0
    )
    data = encode_message({"weights": sd}, {"round": 1}, codecs=codecs).to_bytes()
    s = MessageStream(codec_lookup=lookup)
    feed_pieces(s, data, random.Random(0), 100)
    for msg in [decode_message(data, codec_lookup=lookup), *drain(s)]:
        got = msg.to_torch()["weights"]
        assert got.keys() == sd.keys()
        for k, v in sd.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert torch.equal(got[k], v), k
        twin = small_model()
        with torch.no_grad():
            for p in twin.parameters():
                p.zero_()
        twin.load_state_dict(got)
        x = torch.randn(1, 3, 8, 8)
        model.eval()
        twin.eval()
        assert torch.equal(model(x), twin(x))


def test_bfloat16_and_other_torch_dtypes() -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {
        "bf16": torch.randn(5, 7, generator=g).to(torch.bfloat16),
        "bf16_strided": torch.randn(6, 8, generator=g).to(torch.bfloat16)[::2, 1::3],
        "f16": torch.randn(3, generator=g).half(),
        "bool": torch.tensor([True, False, True]),
        "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.arange(5, dtype=torch.uint8),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "transposed": torch.arange(12, dtype=torch.int32).reshape(3, 4).t(),
        "grad": torch.ones(3, requires_grad=True) * 2,
    }
    data = encode_message(tensors).to_bytes()
    msg = decode_message(data)
    assert msg["bf16"].dtype == np.dtype(ml_dtypes.bfloat16)
    back = msg.to_torch()
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype, k
        assert back[k].shape == v.shape, k
        assert torch.equal(back[k], v.detach()), k
    assert not back["grad"].requires_grad


def test_to_torch_shares_memory_with_writable_buffers() -> None:
    data = bytearray(encode_message({"a": torch.arange(4, dtype=torch.int32)}).to_bytes())
    msg = decode_message(data, copy=True)
    t = msg.to_torch()["a"]
    t[0] = 42
    assert msg["a"][0] == 42
    ro = decode_message(bytes(data)).to_torch()["a"]  # read-only view: copied, still correct
    assert ro.tolist() == [0, 1, 2, 3]


def test_every_wire_dtype_converts_to_torch() -> None:
    rng = np.random.default_rng(2)
    tensors = {}
    for name, dtype in WIRE_DTYPES.items():
        raw = rng.integers(0, 2, 6) if dtype == np.bool_ else rng.integers(0, 100, 6)
        arr = raw.astype(np.float32).astype(dtype) if name == "bfloat16" else raw.astype(dtype)
        tensors[name] = np.asfortranarray(arr.reshape(2, 3))
    msg = decode_message(bytearray(encode_message(tensors).to_bytes()), copy=True)
    back = msg.to_torch()
    for name, arr in tensors.items():
        t = back[name]
        assert tuple(t.shape) == arr.shape, name
        want = arr.astype(np.float32) if name == "bfloat16" else arr
        got = t.float().numpy() if name == "bfloat16" else t.numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)
