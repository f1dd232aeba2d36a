"""Every strategy x compression x topology equals MPI's own Allreduce on random data.

Reference: ``Allreduce`` of the same gradients widened to float64, divided by the world size.
Bounds (per element, S = mean over ranks of |g|, n = world size):
* none:  |err| <= 4 n 2^-24 S (fp32; fp32 sums in another order than MPI's)  and 1e-12 S (fp64)
* fp16:  |err| <= (n + 1) 2^-11 S + (n + 1) 2^-24: one fp16 rounding of each pre-divided
  gradient, one per ring hop of a partial sum, the subnormal spacing for tiny values.
Also: every rank ends with the same bytes, and the overflow flag is False on finite data.
"""
import zlib

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.topology import Topology

STRATS = sorted(comm_lib.STRATEGIES)
CODECS = sorted(comm_lib.COMPRESSIONS)
# name -> (parameter sizes in elements, bucket_bytes)
CASES = {
    "empty": ([0], 4096),
    "one": ([1], 4096),
    "prime": ([10007], 1 << 20),
    "byte_over": ([1023, 1, 1024], 4095),        # 4096 bytes of fp32 against a 4095-byte bucket
    "several": ([3, 4097, 13, 70001, 20000, 0, 5], 64 * 1024),  # ring and small-path buckets
    "big": ([300_000], 8 << 20),                  # one ring bucket, above the small-message path
}


def params_of(sizes, dtype):
    return [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in sizes]


def reference(grads, comm):
    """(mean, mean |g|) over ranks, by MPI's Allreduce in float64."""
    out = []
    for g in grads:
        a = g.double().numpy().copy()
        b = np.abs(a)
        comm.Allreduce(MPI.IN_PLACE, a)
        comm.Allreduce(MPI.IN_PLACE, b)
        out.append((a / comm.Get_size(), b / comm.Get_size()))
    return out


def bound(codec, dtype, n, mean_abs):
    if codec == "fp16":
        return (n + 1) * 2.0**-11 * mean_abs + (n + 1) * 2.0**-24
    eps = 2.0**-24 if dtype == torch.float32 else 1e-12 / 4
    return 4 * n * eps * mean_abs


def check_sync(closer, strategy, codec, topo, sizes, bucket_bytes, dtype=torch.float32, seed=0, overlap=False):
    comm = topo.comm
    rng = np.random.default_rng(seed * 1000 + comm.Get_rank())
    params = params_of(sizes, dtype)
    sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=bucket_bytes, compression=codec,
                                  overlap=overlap))
    for _ in range(2):   # twice: lazy set-up bugs show on the second call
        grads = [torch.from_numpy(rng.standard_normal(n) * 3).to(dtype) for n in sizes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        found_inf = sync.allreduce_grads()
        assert found_inf is False
        for p, (want, mean_abs) in zip(params, reference(grads, comm)):
            err = np.abs(p.grad.double().numpy() - want)
            tol = bound(codec, dtype, comm.Get_size(), mean_abs)
            assert np.all(err <= tol), (strategy, codec, float((err - tol).max()))
        blob = b"".join(p.grad.numpy().tobytes() for p in params)
        assert len(set(comm.allgather(zlib.crc32(blob)))) == 1, "ranks disagree"


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_matches_mpi_allreduce(strategy, codec, case, closer):
    topo = closer(Topology.create(MPI.COMM_WORLD))
    sizes, bucket_bytes = CASES[case]
    check_sync(closer, strategy, codec, topo, sizes, bucket_bytes)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks_per_node", [1, 2, 3])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_emulated_topologies(strategy, codec, ranks_per_node, closer):
    """K ranks per node, uneven last node included (4 ranks, K=3: nodes of 3 and 1)."""
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=ranks_per_node))
    check_sync(closer, strategy, codec, topo, *CASES["several"], seed=ranks_per_node)
    check_sync(closer, strategy, codec, topo, *CASES["big"], seed=ranks_per_node)


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATS)
@pytest.mark.parametrize("ranks_per_node", [0, 2])
def test_float64_exact_enough(strategy, ranks_per_node, closer):
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=ranks_per_node))
    check_sync(closer, strategy, "none", topo, *CASES["several"], dtype=torch.float64)


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATS)
def test_fp16_rejects_float64(strategy, closer):
    topo = closer(Topology.create(MPI.COMM_WORLD))
    with pytest.raises(ValueError, match="comm.compression"):
        closer(comm_lib.create(strategy, params_of([4], torch.float64), topo, bucket_bytes=4096,
                               compression="fp16"))


@pytest.mark.mpi
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_mean_is_readable_per_bucket_without_scatter(strategy, codec, closer):
    """``finish(scatter=False)`` leaves p.grad alone and the mean in ``bucket.result`` (decoded
    from the fp16 wire on first read); a missing gradient counts as zeros."""
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    topo = closer(Topology.create(comm, ranks_per_node=2))
    params = params_of([5, 30000, 7, 11], torch.float32)    # 120 KB: compressed where allowed
    sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=128 * 1024, compression=codec))
    if strategy == "flat" and codec == "fp16" and n > 1:
        assert any(b.packed is not None for b in sync.buckets)
    for p in params[:-1]:
        p.grad = torch.full_like(p, float(comm.Get_rank()))
    sync.begin()
    assert sync.finish(scatter=False) is False
    for p in params[:-1]:
        assert torch.all(p.grad == comm.Get_rank())
    assert params[-1].grad is None
    tol = 0 if codec == "none" else n * 2.0**-11
    for b in sync.buckets:
        for _ in range(2):                     # a second read gives the same
            res = b.result
            for p, off in zip(b.params, b.offsets):
                want = 0.0 if p is params[-1] else (n - 1) / 2
                assert torch.allclose(res[off:off + p.numel()], torch.tensor(want), rtol=tol, atol=0)
