"""Known-answer tests for every gradient-sync strategy, run twice in a row, on several communicators."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.topology import Topology


@pytest.fixture(params=["world", "dup", "self"])
def comm_case(request):
    """(name, communicator): COMM_WORLD, a Dup of it (freed in teardown), COMM_SELF."""
    which = request.param
    if which == "dup":
        comm = MPI.COMM_WORLD.Dup()
        yield which, comm
        comm.Free()
    else:
        yield which, {"world": MPI.COMM_WORLD, "self": MPI.COMM_SELF}[which]


def make_params(sizes, dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in sizes]


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", sorted(comm_lib.STRATEGIES))
def test_grad_equals_rank_gives_mean(strategy, comm_case, closer):
    which, comm = comm_case                    # requested before closer: freed after topo and sync
    topo = closer(Topology.create(comm))
    params = make_params([0, 1, 7, 1031, 5000])
    sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=4 * 1024))  # several buckets
    rank, size = comm.Get_rank(), comm.Get_size()
    for _ in range(2):   # twice: lazy set-up bugs show on the second call
        for p in params:
            p.grad = torch.full_like(p, float(rank))
        sync.allreduce_grads()
        for p in params:
            assert torch.all(p.grad == (size - 1) / 2), (strategy, which)


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", sorted(comm_lib.STRATEGIES))
def test_matches_mpi_allreduce_on_random_data(strategy, closer):
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(100 + comm.Get_rank())
    params = make_params([3, 4097, 13], torch.float64)
    grads = [torch.from_numpy(rng.standard_normal(p.numel())) for p in params]
    topo = closer(Topology.create(comm))
    sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=8 * 4096))
    for p, g in zip(params, grads):
        p.grad = g.clone()
    sync.allreduce_grads()
    for p, g in zip(params, grads):
        want = g.numpy().copy()
        comm.Allreduce(MPI.IN_PLACE, want)
        np.testing.assert_allclose(p.grad.numpy(), want / comm.Get_size(), rtol=1e-12, atol=1e-15)


@pytest.mark.mpi
def test_broadcast_and_checksum_agree():
    comm = MPI.COMM_WORLD
    torch.manual_seed(comm.Get_rank())        # different init on every rank ...
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4))
    model[1].running_mean.fill_(comm.Get_rank())
    comm_lib.broadcast_module(model, comm)    # ... made identical to rank 0's
    sums = comm.allgather(comm_lib.checksum(model.state_dict().values()))
    assert len(set(sums)) == 1
    assert float(model[1].running_mean[0]) == 0.0


@pytest.mark.mpi(min_size=2)
def test_topology_emulated_nodes(closer):
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    topo = closer(Topology.create(comm, ranks_per_node=2))
    assert topo.n_nodes == (size + 1) // 2
    assert topo.local_rank == comm.Get_rank() % 2 and topo.node == comm.Get_rank() // 2
    assert topo.inter.Get_size() == len(range(topo.local_rank, size, 2))
    assert topo.node_sizes == tuple(min(2, size - 2 * k) for k in range(topo.n_nodes))  # 3 ranks: (2, 1)
    assert topo.min_local_size == (1 if size % 2 else 2)
    real = closer(Topology.create(comm))
    assert real.n_nodes == 1 and real.local_size == size   # one host
    assert real.node_sizes == (size,) and real.min_local_size == size


class CountingComm:
    """Forwards to a communicator, counting ``Bcast`` calls."""

    def __init__(self, comm):
        self.comm, self.bcasts = comm, 0

    def Bcast(self, buf, root=0):
        self.bcasts += 1
        return self.comm.Bcast(buf, root=root)

    def Get_rank(self):
        return self.comm.Get_rank()


@pytest.mark.mpi
def test_buffers_broadcast_in_one_bcast_whatever_their_dtypes(monkeypatch):
    """BatchNorm-like buffers of mixed dtypes and shapes (0-d, int64, fp16, bool) become root's
    in one Bcast (issue 22, finding 8); with a small chunk limit, in several, the same bytes."""
    from hpctrain.comm import collectives
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()

    def buffers():
        return [torch.full((64,), r + 0.5), torch.tensor(r + 3), torch.full((3, 5), r + 1.0, dtype=torch.float16),
                torch.tensor([r % 2 == 0, True]), torch.arange(7, dtype=torch.float64) * (r + 1),
                torch.full((1,), r, dtype=torch.int8)]
    want = [torch.full((64,), 0.5), torch.tensor(3), torch.full((3, 5), 1.0, dtype=torch.float16),
            torch.tensor([True, True]), torch.arange(7, dtype=torch.float64), torch.zeros(1, dtype=torch.int8)]
    # 100 bytes: [256 B alone], [8, 30, 2 B], [56, 1 B] (each starts 16-byte aligned)
    for cap, n_bcasts in ((collectives.BCAST_CHUNK_BYTES, 1), (100, 3)):
        monkeypatch.setattr(collectives, "BCAST_CHUNK_BYTES", cap)
        bufs, counting = buffers(), CountingComm(comm)
        collectives.broadcast_tensors(bufs + [torch.empty(0)], counting)
        assert counting.bcasts == n_bcasts
        for got, w in zip(bufs, want):
            assert got.dtype == w.dtype and torch.equal(got, w), (got, w)


@pytest.mark.mpi
def test_channels_last_model_broadcasts_and_trains_like_a_contiguous_one(closer):
    """train.channels_last: the weights' strides differ, the broadcast and a step do not."""
    from hpctrain.job import gpu_settings
    from hpctrain.topology import Topology
    from hpctrain.trainer import DistributedTrainer
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm))
    results = []
    for channels_last in (False, True):
        torch.manual_seed(comm.Get_rank())                  # different on every rank: broadcast fixes it
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                    torch.nn.Linear(4 * 6 * 6, 3))
        model = gpu_settings.model_memory_format(model, channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        trainer = closer(DistributedTrainer(model, opt, topo, strategy="flat", tune="static"))
        assert model[0].weight.is_contiguous() != channels_last
        g = torch.Generator().manual_seed(10 + comm.Get_rank())
        for _ in range(2):
            trainer.step(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
        results.append([p.detach().contiguous().clone() for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    sums = comm.allgather(float(sum(p.double().sum() for p in results[1])))
    assert len(set(sums)) == 1
