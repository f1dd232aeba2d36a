"""Every registered codec implements the whole :class:`~hpctrain.comm.compression.Codec`
contract, and its pack / reduce / unpack equal the same arithmetic done in NumPy."""
import numpy as np
import pytest
import torch

from hpctrain.comm.compression import COMPRESSIONS, Codec
from hpctrain.comm.wire import Wire

SIZES = [3, 70000, 5]       # more than one reduce piece for every codec


def arrays(seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * 100).astype(np.float32) for n in SIZES]


@pytest.mark.parametrize("name", sorted(COMPRESSIONS))
def test_registered_codec_satisfies_the_protocol(name):
    codec = COMPRESSIONS[name]()
    assert isinstance(codec, Codec)
    assert codec.name == name and isinstance(codec.compresses, bool) and isinstance(codec.mpi_summable, bool)
    codec.check_dtype(torch.float32)


@pytest.mark.parametrize("name", sorted(COMPRESSIONS))
def test_pack_reduce_unpack_round_trip_equals_numpy(name):
    codec, n, scale = COMPRESSIONS[name](), sum(SIZES), 0.25
    a, b = arrays(1), arrays(2)
    wire_a, wire_b = codec.wire_buffer(n, torch.float32), codec.wire_buffer(n, torch.float32)
    assert wire_a.numel() == n and wire_a.dtype.is_floating_point
    wdt = torch.empty(0, dtype=wire_a.dtype).numpy().dtype     # the wire's element type
    codec.pack([torch.from_numpy(x) for x in a], wire_a, scale)
    codec.pack([torch.from_numpy(x) for x in b], wire_b, scale)
    want_a = (np.concatenate(a) * np.float32(scale)).astype(wdt)
    want_b = (np.concatenate(b) * np.float32(scale)).astype(wdt)
    np.testing.assert_array_equal(wire_a.numpy(), want_a)
    # dst = 0.5 * (src + recv), summed in fp32 and rounded once to the wire type
    dst = torch.empty_like(wire_a)
    assert codec.reduce(dst, wire_b, codec.scratch(n), check=True, src=wire_a, scale=0.5) is False
    want = ((want_a.astype(np.float32) + want_b.astype(np.float32)) * np.float32(0.5)).astype(wdt)
    np.testing.assert_array_equal(dst.numpy(), want)
    outs = [torch.full((k,), float("nan")) for k in SIZES]
    codec.unpack(dst, outs)
    np.testing.assert_array_equal(torch.cat(outs).numpy(), want.astype(np.float32))
    bad = wire_b.clone()
    bad[70001] = float("inf")
    assert codec.reduce(wire_a.clone(), bad, codec.scratch(n), check=True) is True


@pytest.mark.parametrize("name", sorted(COMPRESSIONS))
def test_a_wire_packs_and_unpacks_through_its_codec(name):
    codec = COMPRESSIONS[name]()
    wire = Wire(codec, codec.wire_buffer(sum(SIZES)), whole=True)
    assert wire.packs_bucket
    src = [torch.from_numpy(x) for x in arrays(3)]
    wire.pack(src, 0.5)
    outs = [torch.empty(k) for k in SIZES]
    wire.unpack(outs)
    want = np.concatenate(arrays(3)) * np.float32(0.5)
    np.testing.assert_allclose(torch.cat(outs).numpy(), want, rtol=0 if name == "none" else 2.0**-11)
    assert not Wire().packs_bucket and Wire().codec.name == "none"
