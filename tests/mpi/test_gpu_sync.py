"""Gradient sync of CUDA tensors (the staging path with its CUDA calls): ``-m gpu``.

Not run on the CPU-only machines this was written on (skipped: "needs a CUDA device"); the same
path minus the CUDA calls runs in CI through HPCTRAIN_TEST_STAGING (test_comm_staging.py).

Each test forces the route it is about (``HPCTRAIN_CUDA_AWARE_MPI=0``: staged through host
memory), so it means the same under a CUDA-aware MPI; the direct route's test needs one. Run by
``make test-gpu`` at -n 1 and -n 2.

Every strategy x compression x overlap, staged: parameters on ``cuda:<local rank mod GPUs>``
(ranks may share a GPU) give exactly the bytes of the same parameters on the CPU. Tolerance: none - the
reduction runs on the host on the same bytes either way (the device-to-host copy is exact; fp16
is packed on the GPU by the CuPy kernel, which rounds element-wise as the torch reference the
CPU path packs with), and equal to MPI's
Allreduce mean within the bounds of test_comm_strategies.py.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.api import bind_device
from hpctrain.ops import testhooks
from hpctrain.comm import cuda_mpi, staging
from hpctrain.topology import Topology
from tests.gpu_expect import direct_route_text
from tests.mpi.test_comm_strategies import CASES, CODECS, STRATS, bound, reference

pytestmark = [pytest.mark.mpi, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def staged_route(monkeypatch):
    """Stage device buckets through host memory whatever the MPI library is."""
    monkeypatch.delenv(testhooks.TEST_STAGING, raising=False)
    monkeypatch.setenv(cuda_mpi.AWARE_SWITCH, "0")


def run_rounds(strategy, codec, topo, sizes, bucket_bytes, overlap, device, closer, seed, n_rounds=3,
               direct=False):
    """Backward of sum(p * c) then a sync, ``n_rounds`` times; returns [(coefs, means on CPU)].
    Device buckets must be staged, or with ``direct`` handed to MPI as they are."""
    comm = topo.comm
    params = [torch.nn.Parameter(torch.zeros(n, device=device)) for n in sizes]
    sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=bucket_bytes, compression=codec,
                                  overlap=overlap))
    one_rank = comm.Get_size() == 1 and sync.name == "flat"     # flat on one rank never stages
    for b in sync.buckets:      # CPU: host buffers; device: staged, or direct (CUDA-aware MPI)
        if device.type == "cpu":
            assert b.staging is None
        elif direct or one_rank:
            assert b.staging is None and b.bufs[0].device == device
        else:
            assert b.staging is not None
    rng = np.random.default_rng(seed * 1000 + comm.Get_rank())
    out = []
    for _ in range(n_rounds):
        coefs = [torch.from_numpy(rng.standard_normal(n) * 3).float() for n in sizes]
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        loss = sum((p * c.to(device)).sum() for p, c in zip(params, coefs))
        loss.backward()
        assert sync.finish(scatter=True) is False
        for p in params:
            assert p.grad.device == device
        out.append((coefs, [p.grad.cpu() for p in params]))
    return out


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("ranks_per_node", [0, 1])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_device_tensors_equal_cpu_tensors(strategy, codec, ranks_per_node, overlap, monkeypatch, closer):
    staged_route(monkeypatch)
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node=ranks_per_node))
    device = bind_device(topo, "cuda")
    for case in ("several", "big", "byte_over"):
        sizes, bucket_bytes = CASES[case]
        cpu = run_rounds(strategy, codec, topo, sizes, bucket_bytes, overlap, torch.device("cpu"), closer, 7)
        gpu = run_rounds(strategy, codec, topo, sizes, bucket_bytes, overlap, device, closer, 7)
        for (coefs, want), (_, got) in zip(cpu, gpu):
            for a, b in zip(want, got):
                assert torch.equal(a, b), (strategy, codec, case)
            for g, (mean, mean_abs) in zip(got, reference(coefs, comm)):
                err = np.abs(g.double().numpy() - mean)
                assert np.all(err <= bound(codec, torch.float32, comm.Get_size(), mean_abs))


def test_device_staging_uses_pinned_host_memory(monkeypatch, closer):
    """Several ranks: staged through pinned memory. One rank: kept on the device, no copies."""
    staged_route(monkeypatch)
    topo = closer(Topology.create(MPI.COMM_WORLD))
    device = bind_device(topo, "cuda")
    params = [torch.nn.Parameter(torch.zeros(1000, device=device))]
    sync = closer(comm_lib.create("flat", params, topo, bucket_bytes=1 << 20))
    (b,) = sync.buckets
    if topo.comm.Get_size() == 1:
        assert b.staging is None and b.bufs[0].device == device
        assert direct_route_text(1, device) in sync.describe()
        return
    assert b.staging.cuda and all(buf.is_pinned() for buf in b.bufs)
    assert b.staging.dev[0].device == device
    assert "staged from cuda" in sync.describe()


def test_bind_device_round_robins_local_ranks(closer):
    topo = closer(Topology.create(MPI.COMM_WORLD))
    device = bind_device(topo, "auto")
    assert device == torch.device("cuda", topo.local_rank % torch.cuda.device_count())
    assert torch.cuda.current_device() == device.index
    assert bind_device(topo, "cpu") == torch.device("cpu")


def test_window_registered_and_fp16_packed_on_the_device(monkeypatch, closer):
    """hierarchical's window is page-locked with the driver while the sync lives; flat's fp16
    buckets keep a device wire and a pinned host wire after a round. Every rank's gradient is
    the world size n, so the pre-divided fp16 values are 1 and the mean is n exactly, at any n."""
    staged_route(monkeypatch)
    topo = closer(Topology.create(MPI.COMM_WORLD))
    device = bind_device(topo, "cuda")
    params = [torch.nn.Parameter(torch.zeros(300_000, device=device))]
    sync = closer(comm_lib.create("hierarchical", params, topo, bucket_bytes=8 << 20))
    assert all(buf.is_pinned() for b in sync.buckets for buf in b.bufs)
    assert "registered host memory" in sync.describe()
    sync.close()
    sync = closer(comm_lib.create("flat", params, topo, bucket_bytes=8 << 20, compression="fp16"))
    n = topo.comm.Get_size()
    params[0].grad = torch.full_like(params[0], float(n))
    sync.allreduce_grads()
    for b in sync.buckets:
        if b.packed is not None:
            assert b.packed.is_pinned() and b.staging.dev_wire.device == device
    assert torch.equal(params[0].grad, torch.full_like(params[0], float(n)))


@pytest.mark.skipif(not __import__("hpctrain.comm.cuda_mpi", fromlist=["x"]).cuda_aware()[0],
                    reason="needs a CUDA-aware MPI (HPCTRAIN_CUDA_AWARE_MPI=1 or the library's answer)")
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("case", ["several", "big"])
def test_cuda_aware_mpi_reduces_device_buffers_directly(case, overlap, monkeypatch, closer):
    """flat, codec none, CUDA-aware MPI: device buffers go to MPI as they are (no staging) and
    the means equal the CPU path's within the fp32 bound (MPI may sum on the device in another
    order than on the host). Overlapped, MPI's buckets take the ring unless the library's
    non-blocking collectives take device memory (issue 22, finding 1: Iallreduce of device
    memory crashes Open MPI)."""
    monkeypatch.delenv(testhooks.TEST_STAGING, raising=False)
    topo = closer(Topology.create(MPI.COMM_WORLD))
    device = bind_device(topo, "cuda")
    sizes, bucket_bytes = CASES[case]
    cpu = run_rounds("flat", "none", topo, sizes, bucket_bytes, overlap, torch.device("cpu"), closer, 5)
    params = [torch.nn.Parameter(torch.zeros(n, device=device)) for n in sizes]
    sync = closer(comm_lib.create("flat", params, topo, bucket_bytes=bucket_bytes, overlap=overlap))
    assert all(b.staging is None and b.bufs[0].is_cuda for b in sync.buckets)
    # one rank keeps its buckets on the device and hands nothing to MPI (issue 34, N1)
    assert direct_route_text(topo.comm.Get_size(), device) in sync.describe()
    gpu = run_rounds("flat", "none", topo, sizes, bucket_bytes, overlap, device, closer, 5, direct=True)
    n = topo.comm.Get_size()
    for (coefs, a), (_, b) in zip(cpu, gpu):
        for x, y, c in zip(a, b, coefs):
            largest = topo.comm.allreduce(float(c.abs().max()) if c.numel() else 0.0, op=MPI.MAX)
            assert torch.allclose(x, y, rtol=0, atol=4 * n * 2.0**-24 * largest + 1e-30)
