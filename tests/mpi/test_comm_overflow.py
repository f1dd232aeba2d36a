"""The overflow flag: pre-division keeps large fp16 gradients finite, and a real inf or NaN on any
one rank raises the flag on every rank."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.topology import Topology

STRATS = comm_lib.concrete()     # auto is one of them (tests/mpi/test_comm_auto.py)
CODECS = sorted(comm_lib.COMPRESSIONS)
SIZES = [5, 70_000]          # a small-message bucket and a ring bucket


def make(strategy, codec, topo):
    params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    return params, comm_lib.create(strategy, params, topo, bucket_bytes=64 * 1024, compression=codec)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks_per_node", [0, 1, 2])
@pytest.mark.parametrize("strategy", STRATS)
def test_fp16_pre_division_keeps_60000_finite(strategy, ranks_per_node):
    """Sum of 60000 over 4 ranks is 240000 > 65504 (fp16 max): only pre-division keeps it finite."""
    comm = MPI.COMM_WORLD
    topo = Topology.create(comm, ranks_per_node=ranks_per_node)
    params, sync = make(strategy, "fp16", topo)
    signs = [torch.from_numpy(np.where(np.arange(n) % 2, 1.0, -1.0).astype(np.float32)) for n in SIZES]
    for p, s in zip(params, signs):
        p.grad = s * 60000.0
    found = sync.allreduce_grads()
    assert found is False
    for p, s in zip(params, signs):
        torch.testing.assert_close(p.grad, s * 60000.0, rtol=comm.Get_size() * 2**-11, atol=0)
    assert all(comm.allgather(found is False))
    sync.close()
    topo.close()


@pytest.mark.mpi
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), 1e6])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_flag_raised_on_every_rank(strategy, codec, bad):
    """One bad value on the last rank: inf/NaN always, 1e6 only where fp16 must round it to inf."""
    comm = MPI.COMM_WORLD
    topo = Topology.create(comm, ranks_per_node=2)
    params, sync = make(strategy, codec, topo)
    # fp16 only rounds what crosses the wire: nothing on 1 rank or, for hierarchical, on 1 node;
    # small buckets (<= 64 KiB) always travel in fp32.
    wire = topo.n_nodes > 1 if strategy == "hierarchical" else comm.Get_size() > 1
    for where in (0, 1):                       # in the small bucket, then in the ring bucket
        expect = not np.isfinite(bad) or (codec == "fp16" and wire and where == 1
                                          and bad / comm.Get_size() > 65504)
        for p in params:
            p.grad = torch.ones_like(p)
        if comm.Get_rank() == comm.Get_size() - 1:
            params[where].grad[params[where].numel() // 2] = bad
        flags = comm.allgather(sync.allreduce_grads())
        assert flags == [expect] * comm.Get_size(), (where, flags)
        for p in params:                        # the next round is clean again
            p.grad = torch.ones_like(p)
        assert sync.allreduce_grads() is False
    sync.close()
    topo.close()
