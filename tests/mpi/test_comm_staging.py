"""The host staging path of device buckets (hpctrain.comm.staging), run on CPU stand-ins.

``HPCTRAIN_TEST_STAGING=1`` (set before the sync is created: it is read when the buckets are
made) makes CPU buckets take the path of device buckets: gradients live in separate "device"
buffers, are copied to the host buffers MPI reduces, and the mean is copied back. Only the CUDA
calls themselves are left to the GPU suite (tests/mpi/test_gpu_sync.py).

Every strategy x compression x topology, overlap on and off, through a real backward (so the
overlap hooks fire and ``p.grad`` views are reused across rounds): the staged sync gives the
bytes of the unstaged one (bit-identical: the same reduction runs on the same host bytes; fp16
is packed from the staged flat buffer, element-wise the same pack), and both equal MPI's
Allreduce mean within the bounds of test_comm_strategies.py.
"""
import zlib

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.comm import staging
from hpctrain.topology import Topology
from tests.mpi.test_comm_strategies import CASES, CODECS, STRATS, bound, reference

STAGING_CASES = ("several", "big", "byte_over", "empty")


def make(strategy, codec, topo, sizes, bucket_bytes, overlap, staged, monkeypatch, closer):
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    with monkeypatch.context() as m:
        if staged:
            m.setenv(staging.TEST_SWITCH, "1")
        else:
            m.delenv(staging.TEST_SWITCH, raising=False)
        sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=bucket_bytes, compression=codec,
                                      overlap=overlap))
    assert all((b.staging is not None) == staged for b in sync.buckets)
    return params, sync


def rounds(params, sync, comm, seed, n_rounds=3):
    """Backward of sum(p * c) (so p.grad = c) then a sync, ``n_rounds`` times; the gradients
    are zeroed in place between rounds (the views survive). Returns [(grads, means)]."""
    rng = np.random.default_rng(seed * 1000 + comm.Get_rank())
    out = []
    for _ in range(n_rounds):
        coefs = [torch.from_numpy(rng.standard_normal(p.numel()) * 3).float() for p in params]
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        loss = sum((p * c).sum() for p, c in zip(params, coefs))
        loss.backward()
        assert sync.finish(scatter=True) is False
        out.append((coefs, [p.grad.clone() for p in params]))
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("ranks_per_node", [0, 1])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_staged_equals_unstaged_and_mpi(strategy, codec, ranks_per_node, overlap, monkeypatch, closer):
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node=ranks_per_node))
    for case in STAGING_CASES:
        sizes, bucket_bytes = CASES[case]
        results = {}
        for staged in (False, True):
            params, sync = make(strategy, codec, topo, sizes, bucket_bytes, overlap, staged, monkeypatch, closer)
            results[staged] = rounds(params, sync, comm, seed=len(sizes))
            for b in sync.buckets:     # p.grad are views of the bucket's home: device side if staged
                home = b.staging.dev if staged else b.bufs
                for p, v in zip(b.params, b.views[1 - b.k]):
                    assert p.grad is v
                    assert v.untyped_storage().data_ptr() == home[1 - b.k].untyped_storage().data_ptr()
            if staged and sync.buckets:
                assert "staged from cpu" in sync.describe()
        for (coefs, plain), (_, staged_means) in zip(results[False], results[True]):
            for a, b in zip(plain, staged_means):
                assert torch.equal(a, b), (strategy, codec, case, "staged differs from unstaged")
            for g, (want, mean_abs) in zip(staged_means, reference(coefs, comm)):
                err = np.abs(g.double().numpy() - want)
                tol = bound(codec, torch.float32, comm.Get_size(), mean_abs)
                assert np.all(err <= tol), (strategy, codec, case, float((err - tol).max()))
            blob = b"".join(g.numpy().tobytes() for g in staged_means)
            assert len(set(comm.allgather(zlib.crc32(blob)))) == 1, "ranks disagree"


@pytest.mark.mpi
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_staged_mean_readable_without_scatter(strategy, codec, monkeypatch, closer):
    """``finish(scatter=False)`` leaves p.grad (on the device side) alone; ``result`` is the
    device-side mean, copied back once; ``scatter_means`` binds the views to it."""
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    topo = closer(Topology.create(comm, ranks_per_node=1))
    params, sync = make(strategy, codec, topo, [5, 30000, 7], 128 * 1024, False, True, monkeypatch, closer)
    for p in params:
        p.grad = torch.full_like(p, float(comm.Get_rank()))
    sync.begin()
    assert sync.finish(scatter=False) is False
    for p in params:
        assert torch.all(p.grad == comm.Get_rank())
    tol = 0 if codec == "none" else n * 2.0**-11
    for b in sync.buckets:
        res = b.result
        assert res is b.staging.dev[1 - b.k] and b.result is res
        assert torch.allclose(res, torch.tensor((n - 1) / 2), rtol=tol, atol=0)
    sync.scatter_means()
    for p in params:
        assert torch.allclose(p.grad, torch.tensor((n - 1) / 2), rtol=tol, atol=0)


def test_cpu_buckets_are_not_staged_without_the_switch(monkeypatch):
    from hpctrain.comm.base import make_buckets
    monkeypatch.delenv(staging.TEST_SWITCH, raising=False)
    ps = [torch.nn.Parameter(torch.zeros(10)) for _ in range(3)]
    assert all(b.staging is None for b in make_buckets(ps, bucket_bytes=80))
    monkeypatch.setenv(staging.TEST_SWITCH, "1")
    buckets = make_buckets(ps, bucket_bytes=80)
    assert buckets and all(b.staging is not None for b in buckets)
    for b in buckets:
        for p, v in zip(b.params, b.views[0]):
            assert v.untyped_storage().data_ptr() == b.staging.dev[0].untyped_storage().data_ptr()
