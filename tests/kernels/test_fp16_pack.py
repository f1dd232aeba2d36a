"""pack_fp16 reference against an independent NumPy computation."""
import numpy as np
import pytest
import torch

from hpctrain import kernels
from hpctrain.kernels import fp16_pack

from .numpy_refs import fp16_bits_equal, mixed_arrays, numpy_pack

F16_MAX = 65504.0


def run_pack(arrays, scale):
    tensors = [torch.from_numpy(a.copy()) for a in arrays]
    out = torch.full((sum(a.size for a in arrays),), 7.0, dtype=torch.float16)
    flag = kernels.pack_fp16(tensors, out, scale)
    for a, t in zip(arrays, tensors):
        np.testing.assert_array_equal(t.numpy(), a)  # inputs untouched
    return out.numpy(), flag


@pytest.mark.parametrize("n", [0, 1, 7, 1001, (1 << 20) + 3])
@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3, 1024.0])
def test_single_tensor_sizes(n, scale):
    a = mixed_arrays(np.random.default_rng(n), [n], magnitude=30.0)
    out, flag = run_pack(a, scale)
    expected = numpy_pack(a, scale)
    fp16_bits_equal(out, expected)
    assert flag.shape == () and flag.dtype == torch.bool
    assert bool(flag) == (not np.isfinite(expected).all())


def test_many_mixed_tensors_and_shapes():
    rng = np.random.default_rng(1)
    sizes = [0, 1, 3, 64, 1000, 0, 131072, 131073, 300_001, 5]
    arrays = mixed_arrays(rng, sizes, magnitude=100.0)
    arrays[3] = arrays[3].reshape(4, 4, 4)
    arrays[6] = arrays[6].reshape(256, 512)
    out, flag = run_pack(arrays, 0.25)
    fp16_bits_equal(out, numpy_pack(arrays, 0.25))
    assert not bool(flag)


@pytest.mark.parametrize("value, expect_flag", [
    (F16_MAX, False), (-F16_MAX, False), (65519.0, False),  # 65519 rounds down to 65504
    (65520.0, True), (-65520.0, True), (1e6, True),
    (float("inf"), True), (float("-inf"), True), (float("nan"), True),
    # fp16 subnormals, one rounding to zero, an fp32 denormal
    (6.0e-8, False), (1e-7, False), (2.9e-8, False), (1e-40, False),
])
def test_fp16_limits(value, expect_flag):
    a = np.array([1.0, value, -2.0], np.float32)
    out, flag = run_pack([a], 1.0)
    fp16_bits_equal(out, numpy_pack([a], 1.0))
    assert bool(flag) == expect_flag


def test_subnormal_results_are_rounded_not_flushed():
    a = np.array([1e-7, -3e-7, 5e-5], np.float32)
    out, _ = run_pack([a], 1.0)
    assert (out[:2] != 0).all() and np.isclose(out[0], 1.1920929e-07)


def test_scale_below_one_brings_value_into_range():
    a = np.array([100_000.0, -131_000.0], np.float32)  # both overflow fp16 unscaled
    out, flag = run_pack([a], 0.5)
    assert not bool(flag)
    np.testing.assert_array_equal(out, np.array([50_000.0, -65_504.0], np.float16))


def test_overflow_only_after_scaling_is_flagged():
    a = np.array([40_000.0, 1.0], np.float32)
    _, unscaled = run_pack([a], 1.0)
    out, scaled = run_pack([a], 2.0)
    assert not bool(unscaled) and bool(scaled) and np.isinf(out[0])


def test_nan_deep_inside_large_tensor_is_found():
    a = np.random.default_rng(2).standard_normal((1 << 20) + 11).astype(np.float32)
    a[777_777] = np.nan
    _, flag = run_pack([a[:500_000], a[500_000:]], 0.5)
    assert bool(flag)


def test_numpy_arrays_in_numpy_flag_out():
    arrays = mixed_arrays(np.random.default_rng(3), [10, 20])
    out = np.empty(30, np.float16)
    flag = kernels.pack_fp16(arrays, out, 3.0)
    assert isinstance(flag, np.ndarray) and flag.dtype == np.bool_ and not flag
    fp16_bits_equal(out, numpy_pack(arrays, 3.0))


def test_reference_matches_dispatch_directly():
    t = [torch.randn(100)]
    a, b = torch.empty(100, dtype=torch.float16), torch.empty(100, dtype=torch.float16)
    fp16_pack.reference(t, a, 0.1)
    kernels.pack_fp16(t, b, 0.1)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("bad, error", [
    (lambda ts, out: (ts, out[:-1]), ValueError),                      # wrong length
    (lambda ts, out: (ts, out.float()), TypeError),                    # out not fp16
    (lambda ts, out: ([t.double() for t in ts], out), TypeError),      # inputs not fp32
    (lambda ts, out: ([ts[0].t(), ts[1]], out), ValueError),           # non-contiguous
    (lambda ts, out: (ts, out.view(2, -1)), ValueError),               # out not 1-D
    (lambda ts, out: ([ts[0].numpy(), ts[1]], out), TypeError),        # mixed kinds
])
def test_bad_arguments_raise(bad, error):
    ts = [torch.randn(4, 3), torch.randn(6)]
    out = torch.empty(18, dtype=torch.float16)
    with pytest.raises(error):
        kernels.pack_fp16(*bad(ts, out), 1.0)


def test_large_finite_values_pass_the_exact_check():
    """Chunks whose sum of squares fails the cheap screen are tested exactly, not flagged."""
    a = np.full((1 << 18) + 5, 65_000.0, np.float32)
    a[::3] = -60_000.0
    out, flag = run_pack([a], 1.0)
    fp16_bits_equal(out, numpy_pack([a], 1.0))
    assert fp16_pack.SAFE_SQ_SUM < float(np.dot(a[:1000], a[:1000])) and not bool(flag)
    a[-1] = 65_520.0  # the only overflow, in the last chunk, after screened-out chunks
    assert bool(run_pack([a], 1.0)[1])
