"""OD-SGD on N ranks: the issue's hand formulas (NumPy) and an independent torch simulation of every
rank, step by step (global and local weights); identical W on all ranks after every completed
global update; SSGD bit for bit inside warm-up; resume from rank 0's checkpoint state; every
strategy, overlap on/off, several buckets, fp16 wire, an injected link delay."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from tests.unit.test_odsgd import (hand_odsgd, linear_batches, linear_model, make_trainer,
                                   rank_slice, save_load, schedule, torch_odsgd)
from hpctrain.optim.schedules import lr_at
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

STEPS = 8


def registered(closer, made):
    """``make_trainer``'s (trainer, topology), both handed to ``closer`` (trainer closed first)."""
    tr, topo = made
    closer(topo)
    return closer(tr), topo


def same_on_all_ranks(comm, tensors) -> bool:
    blobs = comm.allgather(b"".join(t.detach().contiguous().numpy().tobytes() for t in tensors))
    return all(b == blobs[0] for b in blobs)


def mlp(dtype=torch.float64):
    def make():
        torch.manual_seed(21)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(dtype)
    return make


def mlp_batches(n_ranks, steps, dtype=torch.float64):
    g = torch.Generator().manual_seed(8)
    return [(torch.randn(n_ranks * 3, 6, generator=g, dtype=dtype), torch.randint(0, 3, (n_ranks * 3,), generator=g))
            for _ in range(steps)]


@pytest.mark.mpi
@pytest.mark.parametrize("warmup,local_lr", [(0, 0.0), (3, 0.05)])
def test_hand_formulas_on_every_rank(warmup, local_lr, closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    model = linear_model()
    w0 = model.weight.detach().numpy()[0].copy()
    spec = schedule(STEPS)
    tr, topo = registered(closer, make_trainer(comm, model, torch.optim.SGD(model.parameters(), lr=0.2),
                                              spec=spec, warmup_steps=warmup, local_lr=local_lr))
    batches = linear_batches(size, STEPS)
    want = hand_odsgd(w0, batches, size, warmup, [lr_at(t, spec) for t in range(STEPS)], local_lr)
    for t, (x, y) in enumerate(batches):
        tr.step(x[rank_slice(rank)], y[rank_slice(rank)])
        W, local = want[t]
        np.testing.assert_allclose(tr.algo.global_weights()[0].numpy()[0], W, rtol=0, atol=1e-13)
        np.testing.assert_allclose(model.weight.detach().numpy()[0], local[rank], rtol=0, atol=1e-13)
        assert same_on_all_ranks(comm, tr.algo.global_weights())
    if size > 1 and warmup < STEPS:          # the local weights really differ between ranks
        assert not same_on_all_ranks(comm, [model.weight])
    tr.finish()
    assert same_on_all_ranks(comm, [model.weight])


@pytest.mark.mpi
@pytest.mark.parametrize("strategy,ranks_per_node,overlap", [("flat", 0, False), ("flat", 0, True),
                                                             ("hierarchical", 0, True), ("hierarchical", 2, False)])
def test_momentum_lr_schedule_and_dc_match_torch_simulation(strategy, ranks_per_node, overlap, closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    opts = dict(warmup_steps=2, local_momentum=0.3, dc_lambda=0.5)
    make_model, loss_fn = mlp(), torch.nn.CrossEntropyLoss()
    make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-2)  # noqa: E731
    model = make_model()
    spec = schedule(STEPS)
    tr, topo = registered(closer, make_trainer(comm, model, make_opt(model), spec=spec, loss_fn=loss_fn,
                                              strategy=strategy, ranks_per_node=ranks_per_node,
                                              overlap=overlap, bucket_mb=1e-4, **opts))
    assert len(tr.grad_sync.buckets) >= 3
    batches = mlp_batches(size, STEPS)
    ref = torch_odsgd(make_model, make_opt, batches, size, 2, [lr_at(t, spec) for t in range(STEPS)], loss_fn,
                      local_momentum=0.3, dc_lambda=0.5)
    for (x, y), (W, locs) in zip(batches, ref):
        tr.step(x[rank_slice(rank)], y[rank_slice(rank)])
        for got, want in zip(tr.algo.global_weights(), W):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        for got, want in zip(model.parameters(), locs[rank]):
            torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-12)
        assert same_on_all_ranks(comm, tr.algo.global_weights())


@pytest.mark.mpi
def test_fp16_wire_and_injected_delay_stay_close_to_the_reference(closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    make_model, loss_fn = mlp(torch.float32), torch.nn.CrossEntropyLoss()
    make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)  # noqa: E731
    model = make_model()
    tr, topo = registered(closer, make_trainer(comm, model, make_opt(model), loss_fn=loss_fn, compression="fp16",
                                              bucket_mb=1e-4, comm_delay_ms=2.0, warmup_steps=1))
    batches = mlp_batches(size, STEPS, torch.float32)
    ref = torch_odsgd(make_model, make_opt, batches, size, 1, [0.1] * STEPS, loss_fn)
    for (x, y), (W, _) in zip(batches, ref):
        tr.step(x[rank_slice(rank)], y[rank_slice(rank)])
        assert same_on_all_ranks(comm, tr.algo.global_weights())
    for got, want in zip(tr.algo.global_weights(), W):
        torch.testing.assert_close(got, want, rtol=0, atol=5e-3)


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", ["flat", "hierarchical"])
def test_warmup_covering_the_run_is_ssgd_bit_for_bit(strategy, closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    out = []
    for algo, opts in (("ssgd", {}), ("odsgd", {"warmup_steps": STEPS})):
        model = mlp()()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        topo = closer(Topology.create(comm))
        tr = closer(DistributedTrainer(model, opt, topo, strategy=strategy, overlap=True, bucket_mb=1e-4,
                                       algorithm=algo, algorithm_options=opts, schedule=schedule(STEPS)))
        for x, y in mlp_batches(size, STEPS):
            tr.step(x[rank_slice(rank)], y[rank_slice(rank)])
        tr.finish()
        out.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*out))


@pytest.mark.mpi
def test_resume_from_rank0_state_continues_identically(closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    steps, at = 10, 5
    opts = dict(warmup_steps=2, local_momentum=0.5, dc_lambda=0.2)
    make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)  # noqa: E731
    batches = mlp_batches(size, steps)

    def fresh():
        model = mlp()()
        return (*registered(closer, make_trainer(comm, model, make_opt(model), spec=schedule(steps),
                                                 loss_fn=torch.nn.CrossEntropyLoss(), overlap=True, **opts)),
                model)

    a, topo_a, model_a = fresh()
    for t, (x, y) in enumerate(batches):
        if t == at:                       # what the CLI does: finish on all ranks, rank 0 writes
            a.finish()
            saved = comm.bcast(save_load(a.state_dict()) if rank == 0 else None, root=0)
        a.step(x[rank_slice(rank)], y[rank_slice(rank)])
    a.finish()
    b, topo_b, model_b = fresh()
    b.load_state_dict(saved)
    for x, y in batches[at:]:
        b.step(x[rank_slice(rank)], y[rank_slice(rank)])
    b.finish()
    assert all(torch.equal(p, q) for p, q in zip(model_a.parameters(), model_b.parameters()))
    assert same_on_all_ranks(comm, list(model_b.parameters()))
