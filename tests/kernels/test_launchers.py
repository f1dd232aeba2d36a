"""The CuPy launch path on a fake device (tests/kernels/fake_device.py) vs the CPU reference."""
import numpy as np
import pytest

from hpctrain import kernels
from hpctrain.kernels import _runtime
from hpctrain.kernels._prelude import CHUNK_ELEMS

from .fake_device import FakeArray, fake_cupy, parameters
from .numpy_refs import fp16_bits_equal

SIZES = [1, 7, CHUNK_ELEMS - 1, 0, CHUNK_ELEMS, CHUNK_ELEMS + 1, 3 * CHUNK_ELEMS + 5, 1000]


@pytest.fixture
def device(monkeypatch):
    fake = fake_cupy()
    monkeypatch.setattr(_runtime, "probe", lambda: (fake, "fake device"))
    monkeypatch.setattr(_runtime, "_FUNCTIONS", {})
    monkeypatch.setattr(_runtime, "_TABLES", _runtime.TableCache())
    return fake


def host(seed, sizes=SIZES, magnitude=100.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * magnitude).astype(np.float32) for n in sizes]


def on_device(arrays):
    return [FakeArray(a) for a in arrays]


def test_every_kernel_signature_is_parsed():
    for name, source in kernels.SOURCES.items():
        params = parameters(source, name)
        assert params[0] == ("const hpc_i64 *", "table") and params[1] == ("int", "n_tensors")


@pytest.mark.parametrize("scale, poison", [(0.5, None), (1.0, 65520.0), (3.0, np.nan)])
def test_pack(device, scale, poison):
    arrays = host(1)
    if poison is not None:
        arrays[-2][-1] = poison
    want = np.empty(sum(SIZES), np.float16)
    want_flag = kernels.pack_fp16(arrays, want, scale)
    out = FakeArray(np.zeros(sum(SIZES), np.float16))
    flag = kernels.pack_fp16(on_device(arrays), out, scale)
    fp16_bits_equal(out.host, want)
    assert bool(flag.host) == bool(want_flag) == (poison is not None)
    assert [k.launches for k in device.kernels_built] == [1]


@pytest.mark.parametrize("accumulate", [False, True])
def test_unpack(device, accumulate):
    buf = (np.random.default_rng(2).standard_normal(sum(SIZES)) * 30).astype(np.float16)
    initial = host(3)
    want = [a.copy() for a in initial]
    kernels.unpack_fp16(buf, want, 0.25, accumulate=accumulate)
    got = on_device(initial)
    kernels.unpack_fp16(FakeArray(buf), got, 0.25, accumulate=accumulate)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.host, w, rtol=1e-6, atol=1e-6)


def test_sq_norms_and_table_cache(device):
    arrays = host(4)
    want_per, want_norm = kernels.multi_tensor_sq_norms(arrays)
    dev = on_device(arrays)
    for _ in range(2):
        per, norm = kernels.multi_tensor_sq_norms(dev)
        np.testing.assert_allclose(per.host, want_per, rtol=1e-5)
        np.testing.assert_allclose(norm.host, want_norm, rtol=1e-5)
    assert len(_runtime._TABLES) == 1  # second call reused the uploaded table
    others = host(8)  # same sizes, other addresses: must not hit the cached table
    per, _ = kernels.multi_tensor_sq_norms(on_device(others))
    np.testing.assert_allclose(per.host, kernels.multi_tensor_sq_norms(others)[0], rtol=1e-5)
    assert len(_runtime._TABLES) == 2 and dev


@pytest.mark.parametrize("per_tensor", [False, True])
@pytest.mark.parametrize("nesterov", [False, True])
def test_lars(device, per_tensor, nesterov):
    ws, gs, vs = host(5), host(6), host(7)
    steps = np.linspace(0.01, 1.0, len(SIZES)).astype(np.float32)
    want_w, want_v = [w.copy() for w in ws], [v.copy() for v in vs]
    kernels.lars_update(want_w, gs, want_v, steps if per_tensor else 0.3, 1e-4, 0.9, nesterov)
    dw, dv = on_device(ws), on_device(vs)
    step = FakeArray(steps) if per_tensor else 0.3
    kernels.lars_update(dw, on_device(gs), dv, step, 1e-4, 0.9, nesterov)
    for got, want in zip(dw + dv, want_w + want_v):
        np.testing.assert_allclose(got.host, want, rtol=1e-5, atol=1e-4)


def test_only_empty_tensors_launch_nothing(device):
    per, norm = kernels.multi_tensor_sq_norms(on_device([np.zeros(0, np.float32)] * 2))
    assert per.host.tolist() == [0.0, 0.0] and float(norm.host) == 0.0
    assert not device.kernels_built


def one_step(t, buckets, groups):
    """What a step of fp16 staging and LARS asks the cache for: each bucket packs its input
    (``dev[t % 2]``) and unpacks the mean into the other buffer; LARS reads every group's
    weights, momentum and gradients, which are views of the alternating buffers."""
    for dev in buckets:
        wire = FakeArray(np.zeros(dev[0].size, np.float16))
        kernels.pack_fp16([dev[t % 2]], wire, 0.5)
        kernels.unpack_fp16(wire, [dev[(t + 1) % 2]], 1.0)
    for ws, vs, gs in groups:
        kernels.multi_tensor_sq_norms(ws + gs[t % 2])
        kernels.lars_update(ws, gs[t % 2], vs, 0.1, 1e-4, 0.9)


def test_table_cache_does_not_thrash_on_alternating_buffers(device):
    """issue 34, N7: 12 double-buffered buckets and 3 LARS groups make 42 keys a step pair;
    after the first two steps (both buffers seen) every lookup hits. The same access pattern
    through a 32-entry cache misses every time: that is what the default capacity avoids."""
    buckets = [on_device(host(10 + i, [64, 64])) for i in range(12)]
    groups = [(on_device(host(30 + i, [32, 16])), on_device(host(40 + i, [32, 16])),
               [on_device(host(50 + i, [32, 16])), on_device(host(60 + i, [32, 16]))]) for i in range(3)]
    for t in range(2):
        one_step(t, buckets, groups)
    cache = _runtime._TABLES
    warm_keys, misses, hits = len(cache), cache.misses, cache.hits
    assert warm_keys > 32
    for t in range(2, 6):
        one_step(t, buckets, groups)
    assert cache.misses == misses and cache.hits - hits == 4 * (2 * 12 + 3 * 4)
    small = _runtime.TableCache(32)
    _runtime._TABLES = small
    try:
        for t in range(6):
            one_step(t, buckets, groups)
    finally:
        _runtime._TABLES = cache
    assert small.hits == 0
