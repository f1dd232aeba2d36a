"""Gradients that live in the buckets (DDP's ``gradient_as_bucket_view``): after a sync every
``p.grad`` is a view of its bucket (the shared window for ``hierarchical``), the next backward
accumulates there and the next sync copies nothing; what breaks the views - a second backward
while the round is in flight, ``zero_grad(set_to_none=True)``, an optimiser that assigns
``.grad``, a round without scatter - gives the same means as plain copies would. Expectations
come from MPI's ``Allreduce`` of each rank's own gradients."""
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.topology import Topology

STRATS = sorted(comm_lib.STRATEGIES)


def model_and_batches(rank, n=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5))
    g = torch.Generator().manual_seed(10 + rank)
    return model, [(torch.randn(8, 20, generator=g), torch.randint(0, 5, (8,), generator=g)) for _ in range(n)]


def backward(model, x, y):
    torch.nn.functional.cross_entropy(model(x), y).backward()


def mean_of(comm, grads):
    out = []
    for g in grads:
        a = g.detach().numpy().copy()
        comm.Allreduce(MPI.IN_PLACE, a)
        out.append(torch.from_numpy(a) / comm.Get_size())
    return out


def local_grads(rank, batches):
    """This rank's own gradients of each batch, no communication (fresh model each time)."""
    out = []
    for x, y in batches:
        model, _ = model_and_batches(rank)
        backward(model, x, y)
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def in_bucket(sync, p) -> bool:
    storages = {b.data_ptr() for bucket in sync.buckets for b in bucket.bufs}
    base = p.grad.untyped_storage().data_ptr()
    return base in storages


def assert_means(comm, model, grads):
    for p, want in zip(model.parameters(), mean_of(comm, grads)):
        torch.testing.assert_close(p.grad, want, rtol=1e-6, atol=1e-7)


@pytest.fixture(params=[(s, o) for s in STRATS for o in (False, True)], ids=lambda v: f"{v[0]}-overlap{v[1]}")
def setup(request, closer):
    strategy, overlap = request.param
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node=2))
    model, batches = model_and_batches(topo.rank)
    sync = closer(comm_lib.create(strategy, model.parameters(), topo, bucket_bytes=4096, overlap=overlap))
    return comm, model, batches, sync


@pytest.mark.mpi
def test_grads_are_bucket_views_and_steps_copy_nothing(setup):
    comm, model, batches, sync = setup
    own = local_grads(comm.Get_rank(), batches)
    for t, (x, y) in enumerate(batches):
        model.zero_grad(set_to_none=False)
        backward(model, x, y)
        if t > 0:                           # the backward accumulated into last round's views
            assert all(in_bucket(sync, p) for p in model.parameters())
        assert sync.allreduce_grads() is False
        assert all(in_bucket(sync, p) for p in model.parameters())
        assert_means(comm, model, own[t])


@pytest.mark.mpi
def test_set_to_none_and_assigned_grads_are_copied_in(setup):
    comm, model, batches, sync = setup
    own = local_grads(comm.Get_rank(), batches)
    (x0, y0), (x1, y1), (x2, y2) = batches
    backward(model, x0, y0)
    sync.allreduce_grads()
    model.zero_grad(set_to_none=True)        # fresh tensors from autograd
    backward(model, x1, y1)
    assert not any(in_bucket(sync, p) for p in model.parameters())
    sync.allreduce_grads()
    assert_means(comm, model, own[1])
    assert all(in_bucket(sync, p) for p in model.parameters())
    model.zero_grad(set_to_none=False)
    backward(model, x2, y2)
    for p in model.parameters():             # an optimiser that replaces .grad (clipping, say)
        p.grad = p.grad.clone() * 1.0
    sync.allreduce_grads()
    assert_means(comm, model, own[2])


@pytest.mark.mpi
def test_round_without_scatter_keeps_own_grads_twice_in_a_row(setup):
    """``finish(scatter=False)`` twice: p.grad stays this rank's own both times (the non-finite
    diagnosis reads it), while ``out`` receives each round's mean."""
    comm, model, batches, sync = setup
    own = local_grads(comm.Get_rank(), batches)
    (x0, y0), (x1, y1), _ = batches
    backward(model, x0, y0)
    sync.allreduce_grads()
    for t, (x, y) in ((0, (x0, y0)), (1, (x1, y1))):
        model.zero_grad(set_to_none=False)
        backward(model, x, y)
        sync.begin()
        assert sync.finish(scatter=False) is False
        for p, g in zip(model.parameters(), own[t]):
            torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
    sync.scatter_means()
    assert_means(comm, model, own[1])
    assert all(in_bucket(sync, p) for p in model.parameters())


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATS)
def test_second_backward_in_flight_after_views_were_bound(strategy, closer):
    """Round 1 binds the views; in round 2 every bucket is in flight when a second backward
    runs: the round reduces g1 only and p.grad ends as g1 + g2 (private), nothing corrupted."""
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node=2))
    model, batches = model_and_batches(topo.rank)
    (x0, y0), (x1, y1), (x2, y2) = batches
    sync = closer(comm_lib.create(strategy, model.parameters(), topo, bucket_bytes=4096, overlap=True))
    backward(model, x0, y0)
    sync.allreduce_grads()
    own = local_grads(comm.Get_rank(), [(x1, y1), (x2, y2)])
    model.zero_grad(set_to_none=False)
    backward(model, x1, y1)
    assert len(sync.started) == len(sync.buckets)
    backward(model, x2, y2)
    assert sync.finish(scatter=False) is False
    for p, g1, g2 in zip(model.parameters(), *own):
        assert not in_bucket(sync, p)
        torch.testing.assert_close(p.grad, g1 + g2, rtol=1e-6, atol=1e-7)
    sync.scatter_means()
    assert_means(comm, model, own[0])


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATS)
def test_close_gives_grads_back(strategy, closer):
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node=2))
    model, batches = model_and_batches(topo.rank)
    sync = comm_lib.create(strategy, model.parameters(), topo, bucket_bytes=4096)
    backward(model, *batches[0])
    sync.allreduce_grads()
    means = [p.grad.clone() for p in model.parameters()]
    sync.close()
    for p, m in zip(model.parameters(), means):
        assert torch.equal(p.grad, m)
        p.grad.add_(1.0)                     # private memory: writable after the window is gone
