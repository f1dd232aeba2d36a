"""unpack_fp16 reference against an independent NumPy computation."""
import numpy as np
import pytest
import torch

from hpctrain import kernels

from .numpy_refs import mixed_arrays, numpy_pack


def f16(values):
    return np.asarray(values, np.float32).astype(np.float16)


def split(flat, shapes):
    parts, offset = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        parts.append(flat[offset:offset + n].reshape(shape))
        offset += n
    return parts


def run_unpack(buf, shapes, scale, accumulate=False, initial=None):
    initial = initial or [np.full(s, 3.0, np.float32) for s in shapes]
    tensors = [torch.from_numpy(a.copy()) for a in initial]
    kernels.unpack_fp16(torch.from_numpy(buf), tensors, scale, accumulate=accumulate)
    return [t.numpy() for t in tensors]


@pytest.mark.parametrize("n", [0, 1, 7, 1001, (1 << 20) + 3])
@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3, 2.0**-14])
def test_overwrite_sizes(n, scale):
    buf = f16(np.random.default_rng(n).standard_normal(n) * 1000)
    (got,) = run_unpack(buf, [(n,)], scale)
    expected = buf.astype(np.float32) * np.float32(scale)  # exact: one fp32 rounding
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("scale", [1.0, 0.125, 1 / 6])
def test_accumulate_adds_into_existing_values(scale):
    rng = np.random.default_rng(4)
    shapes = [(0,), (3,), (17, 5), (300_001,), (131_072,)]
    total = sum(int(np.prod(s)) for s in shapes)
    buf = f16(rng.standard_normal(total) * 50)
    initial = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = run_unpack(buf, shapes, scale, accumulate=True, initial=initial)
    expected = split(buf.astype(np.float64) * scale, shapes)
    for g, e, a in zip(got, expected, initial):
        # at most two fp32 roundings (product, sum), each within 2**-24 of the larger operand
        bound = 2.0**-23 * (np.abs(a) + np.abs(e))
        assert np.all(np.abs(g - (a.astype(np.float64) + e)) <= bound)


def test_many_tensors_land_in_their_own_slices():
    shapes = [(i % 7, 3) for i in range(40)] + [(2, 2, 2)]
    total = sum(int(np.prod(s)) for s in shapes)
    buf = f16(np.arange(total) % 2048)  # distinct per slot, exact in fp16
    got = run_unpack(buf, shapes, 1.0)
    for g, e in zip(got, split(buf.astype(np.float32), shapes)):
        np.testing.assert_array_equal(g, e)


def test_specials_propagate():
    buf = np.array([np.inf, -np.inf, np.nan, 6e-8, 65504, -0.0], np.float16)
    (got,) = run_unpack(buf, [(6,)], 0.5)
    np.testing.assert_array_equal(got, buf.astype(np.float32) * np.float32(0.5))
    assert np.signbit(got[5])


def test_pack_then_unpack_round_trip():
    rng = np.random.default_rng(5)
    arrays = mixed_arrays(rng, [1000, 1, 77_777], magnitude=1e3)
    scale = 1 / 64
    packed = numpy_pack(arrays, scale)
    got = run_unpack(packed, [a.shape for a in arrays], 1 / scale)
    for g, a in zip(got, arrays):
        np.testing.assert_allclose(g, a, rtol=2**-11, atol=64 * 2**-24)


def test_numpy_arrays_are_written_in_place():
    buf = f16([1, 2, 3, 4])
    a, b = np.zeros(1, np.float32), np.ones(3, np.float32)
    kernels.unpack_fp16(buf, [a, b], 2.0, accumulate=True)
    np.testing.assert_array_equal(np.concatenate([a, b]), [2, 5, 7, 9])


def test_wrong_buffer_length_raises():
    with pytest.raises(ValueError):
        kernels.unpack_fp16(torch.zeros(5, dtype=torch.float16), [torch.zeros(4)], 1.0)
    with pytest.raises(TypeError):
        kernels.unpack_fp16(torch.zeros(4), [torch.zeros(4)], 1.0)
