"""CUDA kernels against the CPU reference (needs CuPy and a CUDA device; skipped otherwise).

CuPy arrays exercise the kernels even with the CPU-only torch wheel; the torch-CUDA cases also
need a CUDA build of torch.
"""
import numpy as np
import pytest
import torch

from hpctrain import kernels
from hpctrain.kernels._prelude import CHUNK_ELEMS

from .numpy_refs import fp16_bits_equal

cupy = pytest.importorskip("cupy", reason="CuPy not installed (pip install 'hpctrain[cuda]')",
                           exc_type=ImportError)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cupy.is_available(), reason="cupy.is_available() is False (no GPU)"),
]
needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                      reason="torch built without CUDA")

SIZES = [1, 7, CHUNK_ELEMS - 1, CHUNK_ELEMS, CHUNK_ELEMS + 1, 0, 3 * CHUNK_ELEMS + 5, 1000, 1 << 20]


def host_arrays(seed, sizes=SIZES, magnitude=100.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * magnitude).astype(np.float32) for n in sizes]


@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3, 700.0])
def test_pack_cupy_matches_reference(scale):
    arrays = host_arrays(10)
    arrays[2][5] = 65519.0 / scale  # stays finite unless scale pushes it over
    total = sum(a.size for a in arrays)
    want = np.empty(total, np.float16)
    want_flag = kernels.pack_fp16(arrays, want, scale)
    out = cupy.full(total, 3.0, dtype=cupy.float16)
    flag = kernels.pack_fp16([cupy.asarray(a) for a in arrays], out, scale)
    assert isinstance(flag, cupy.ndarray) and flag.shape == ()
    fp16_bits_equal(cupy.asnumpy(out), want)
    assert bool(flag) == bool(want_flag)


@pytest.mark.parametrize("value", [65520.0, np.inf, -np.inf, np.nan])
def test_pack_flags_in_the_last_chunk_of_a_big_tensor(value):
    arrays = host_arrays(11, [5, 4 * CHUNK_ELEMS + 3], magnitude=1.0)
    arrays[1][-1] = value
    out = cupy.empty(sum(a.size for a in arrays), dtype=cupy.float16)
    assert bool(kernels.pack_fp16([cupy.asarray(a) for a in arrays], out, 1.0))
    out2 = cupy.empty_like(out)
    assert not bool(kernels.pack_fp16([cupy.asarray(a) for a in host_arrays(11, [5, 7])],
                                      out2[:12], 1.0))


@pytest.mark.parametrize("accumulate", [False, True])
def test_unpack_cupy_matches_reference(accumulate):
    rng = np.random.default_rng(12)
    total = sum(SIZES)
    buf = (rng.standard_normal(total) * 30).astype(np.float16)
    initial = host_arrays(13)
    want = [a.copy() for a in initial]
    kernels.unpack_fp16(buf, want, 0.25, accumulate=accumulate)
    got = [cupy.asarray(a) for a in initial]
    kernels.unpack_fp16(cupy.asarray(buf), got, 0.25, accumulate=accumulate)
    contributions = np.split(buf.astype(np.float64) * 0.25, np.cumsum(SIZES)[:-1])
    for g, w, a, e in zip(got, want, initial, contributions):
        if accumulate:  # fma on the GPU, maybe two roundings on the CPU
            assert np.all(np.abs(cupy.asnumpy(g) - w) <= 2.0**-22 * (np.abs(a) + np.abs(e)))
        else:
            np.testing.assert_array_equal(cupy.asnumpy(g), w)


def test_sq_norms_cupy_matches_reference_and_is_deterministic():
    arrays = host_arrays(14)
    want_per, want_norm = kernels.multi_tensor_sq_norms(arrays)
    dev = [cupy.asarray(a) for a in arrays]
    per, norm = kernels.multi_tensor_sq_norms(dev)
    np.testing.assert_allclose(cupy.asnumpy(per), want_per, rtol=1e-5)
    np.testing.assert_allclose(float(norm), float(want_norm), rtol=1e-5)
    per2, norm2 = kernels.multi_tensor_sq_norms(dev)  # second call: cached table, same bits
    assert cupy.array_equal(per, per2) and float(norm) == float(norm2)
    assert float(per[SIZES.index(0)]) == 0.0


def test_sq_norms_all_empty_tensors():
    per, norm = kernels.multi_tensor_sq_norms([cupy.zeros(0, cupy.float32)] * 3)
    assert cupy.asnumpy(per).tolist() == [0.0, 0.0, 0.0] and float(norm) == 0.0


@needs_torch_cuda
def test_torch_cuda_tensors_on_a_side_stream():
    arrays = host_arrays(15)
    want = np.empty(sum(a.size for a in arrays), np.float16)
    want_flag = kernels.pack_fp16(arrays, want, 0.5)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        tensors = [torch.from_numpy(a).cuda(non_blocking=False) for a in arrays]
        out = torch.empty(want.size, dtype=torch.float16, device="cuda")
        flag = kernels.pack_fp16(tensors, out, 0.5)
        per, norm = kernels.multi_tensor_sq_norms(tensors)
        back = [torch.empty_like(t) for t in tensors]
        kernels.unpack_fp16(out, back, 2.0)
    stream.synchronize()
    assert isinstance(flag, torch.Tensor) and flag.is_cuda and bool(flag) == bool(want_flag)
    fp16_bits_equal(out.cpu().numpy(), want)
    want_per, _ = kernels.multi_tensor_sq_norms(arrays)
    np.testing.assert_allclose(per.cpu().numpy(), want_per, rtol=1e-5)
    for b, a in zip(back, arrays):
        np.testing.assert_allclose(b.cpu().numpy(), a, rtol=2**-10, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("per_tensor", [False, True])
def test_lars_cupy_matches_reference(nesterov, per_tensor):
    ws, gs, vs = host_arrays(16), host_arrays(17), host_arrays(18)
    steps = np.linspace(0.01, 1.0, len(SIZES)).astype(np.float32)
    want_w, want_v = [w.copy() for w in ws], [v.copy() for v in vs]
    kernels.lars_update(want_w, gs, want_v, steps if per_tensor else 0.3, 1e-4, 0.9, nesterov)
    dw, dv = [cupy.asarray(w) for w in ws], [cupy.asarray(v) for v in vs]
    step = cupy.asarray(steps) if per_tensor else 0.3
    kernels.lars_update(dw, [cupy.asarray(g) for g in gs], dv, step, 1e-4, 0.9, nesterov)
    for got, want in zip(dw + dv, want_w + want_v):
        np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-5, atol=1e-4)
