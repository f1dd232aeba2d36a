"""Overlap with backward: the hook path gives the same bytes as the blocking path, hooks really
start buckets during backward, and a second backward before finish() leaves the round intact."""
import zlib

import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.topology import Topology

STRATS = sorted(comm_lib.STRATEGIES)
CODECS = sorted(comm_lib.COMPRESSIONS)


def model_and_data(rank, n_batches=2):
    torch.manual_seed(0)                       # same weights everywhere
    model = torch.nn.Sequential(torch.nn.Linear(40, 300), torch.nn.Tanh(), torch.nn.Linear(300, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 10))
    g = torch.Generator().manual_seed(100 + rank)   # different data on every rank
    data = [(torch.randn(16, 40, generator=g), torch.randint(0, 10, (16,), generator=g))
            for _ in range(n_batches)]
    return model, data


def backward(model, x, y):
    torch.nn.functional.cross_entropy(model(x), y).backward()


def grad_bytes(model):
    return b"".join(p.grad.numpy().tobytes() for p in model.parameters())


def run(strategy, codec, topo, overlap, closer):
    model, data = model_and_data(topo.rank)
    sync = closer(comm_lib.create(strategy, model.parameters(), topo, bucket_bytes=8 * 1024,
                                  compression=codec, overlap=overlap))
    out = []
    for x, y in data:                          # two rounds: buffers reused
        model.zero_grad(set_to_none=False)
        backward(model, x, y)
        started = len(sync.started)
        assert sync.allreduce_grads() is False
        out.append(grad_bytes(model))
    return out, started, len(sync.buckets)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks_per_node", [0, 2])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_overlap_is_bit_identical(strategy, codec, ranks_per_node, closer):
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=ranks_per_node))
    blocking, started0, n_buckets = run(strategy, codec, topo, overlap=False, closer=closer)
    overlapped, started1, _ = run(strategy, codec, topo, overlap=True, closer=closer)
    assert n_buckets >= 4
    assert started0 == 0                       # nothing starts without hooks ...
    assert started1 == n_buckets               # ... every bucket starts during backward with them
    assert blocking == overlapped
    digests = topo.comm.allgather([zlib.crc32(b) for b in overlapped])
    assert all(d == digests[0] for d in digests)


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATS)
def test_second_backward_before_finish(strategy, closer):
    """In-flight buckets keep the first backward's gradients; the second only touches p.grad."""
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node=2))
    (x1, y1), (x2, y2) = model_and_data(topo.rank)[1]
    # Reference: the mean of the first backward's gradients, blocking path.
    ref_model, _ = model_and_data(topo.rank)
    ref = closer(comm_lib.create(strategy, ref_model.parameters(), topo, bucket_bytes=8 * 1024))
    backward(ref_model, x1, y1)
    ref.allreduce_grads()
    # Local gradients of both backwards, no communication.
    loc_model, _ = model_and_data(topo.rank)
    backward(loc_model, x1, y1)
    backward(loc_model, x2, y2)

    model, _ = model_and_data(topo.rank)
    sync = closer(comm_lib.create(strategy, model.parameters(), topo, bucket_bytes=8 * 1024, overlap=True))
    backward(model, x1, y1)
    assert len(sync.started) == len(sync.buckets)
    backward(model, x2, y2)                    # while the round is in flight
    assert sync.finish(scatter=False) is False
    for p, q in zip(model.parameters(), loc_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)   # p.grad: g1 + g2, untouched
    twin = dict(zip(map(id, model.parameters()), ref_model.parameters()))
    for b in sync.buckets:
        want = torch.cat([twin[id(p)].grad.reshape(-1) for p in b.params])
        torch.testing.assert_close(b.result, want, rtol=0, atol=0)    # the round: mean of g1
    # Next round: begin() gathers the accumulated g1 + g2 and averages them.
    assert sync.allreduce_grads() is False
    for p, q in zip(model.parameters(), loc_model.parameters()):
        want = q.grad.numpy().copy()
        comm.Allreduce(MPI.IN_PLACE, want)
        torch.testing.assert_close(p.grad, torch.from_numpy(want) / comm.Get_size(),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [False, True])
def test_only_a_round_finish_starts_is_blocking(overlap, closer):
    """flat may use MPI's blocking Allreduce only where every rank starts every bucket in
    finish(): never for buckets started by hooks or by begin() (they run concurrently)."""
    topo = closer(Topology.create(MPI.COMM_WORLD))
    model, data = model_and_data(topo.rank)
    sync = closer(comm_lib.create("flat", model.parameters(), topo, bucket_bytes=8 * 1024, overlap=overlap))
    seen = []
    reduce = sync.reduce_bucket

    def spy(bucket):
        seen.append(sync.blocking_round)
        return reduce(bucket)
    sync.reduce_bucket = spy
    x, y = data[0]
    backward(model, x, y)
    sync.allreduce_grads()
    assert seen and seen == [not overlap] * len(sync.buckets)
    seen.clear()
    backward(model, x, y)
    sync.begin()
    sync.finish()
    assert seen == [False] * len(sync.buckets)
