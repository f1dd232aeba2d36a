"""N ranks with per-rank batch b == one process with the global batch N·b (the SSGD contract)."""
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.models.small import SmallCNN
from hpctrain.topology import Topology

STEPS, PER_RANK = 5, 4


def global_batches(world_size, steps=STEPS):
    g = torch.Generator().manual_seed(1234)
    for _ in range(steps):
        x = torch.randn(world_size * PER_RANK, 1, 8, 8, generator=g, dtype=torch.float64)
        y = torch.randint(0, 10, (world_size * PER_RANK,), generator=g)
        yield x, y


def fresh_model():
    torch.manual_seed(7)
    return SmallCNN(batchnorm=False).double()


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", sorted(comm_lib.STRATEGIES))
def test_ranks_equal_single_process_global_batch(strategy, closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    # distributed: each rank takes its slice of every global batch
    torch.manual_seed(rank)                 # deliberately different init before the broadcast
    model = fresh_model() if rank == 0 else SmallCNN(batchnorm=False).double()
    comm_lib.broadcast_module(model, comm)
    topo = closer(Topology.create(comm))
    sync = closer(comm_lib.create(strategy, model.parameters(), topo, bucket_bytes=16 * 1024))
    opt = sgd(model)
    for x, y in global_batches(size):
        opt.zero_grad()
        sl = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        torch.nn.functional.cross_entropy(model(x[sl]), y[sl]).backward()
        sync.allreduce_grads()
        opt.step()
    # reference: one process, the whole global batch
    ref = fresh_model()
    ref_opt = sgd(ref)
    for x, y in global_batches(size):
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    with torch.no_grad():
        diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
        moved = max(float((a - b).abs().max()) for a, b in zip(ref.parameters(), fresh_model().parameters()))
    assert diff <= 1e-10, f"max abs diff {diff}"
    assert moved > 1e-3                      # the test trained something
    sums = comm.allgather(comm_lib.checksum(model.parameters()))
    assert len(set(sums)) == 1, sums
