"""Non-finite numbers on N ranks: a NaN loss or gradient on ONE rank stops EVERY rank at the same
step with the same NonFiniteError naming that rank (nobody left waiting in a collective); an fp16
wire overflow of finite gradients is skipped on every rank with the weights untouched, and stops
the run after MAX_WIRE_SKIPS in a row. Expectations come from NumPy (fp16 rounding of the mean)
and from snapshots of the weights, not from the code under test."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.update import SSGD, NonFiniteError
from hpctrain.update.ssgd import MAX_WIRE_SKIPS
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

STRATS = sorted(comm_lib.STRATEGIES)


def same_on_all_ranks(comm, tensors) -> bool:
    blobs = comm.allgather(b"".join(t.detach().contiguous().numpy().tobytes() for t in tensors))
    return all(b == blobs[0] for b in blobs)


def error_on_every_rank(comm, step_fn) -> str:
    """Run ``step_fn`` on every rank; it must raise NonFiniteError everywhere, with one message."""
    try:
        step_fn()
        msg = None
    except NonFiniteError as exc:
        msg = str(exc)
    msgs = comm.allgather(msg)
    assert None not in msgs, msgs
    assert len(set(msgs)) == 1, msgs
    return msgs[0]


def mlp_trainer(closer, comm, strategy, algorithm="ssgd", **opts):
    topo = closer(Topology.create(comm, ranks_per_node=1))
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    tr = closer(DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), topo,
                                   strategy=strategy, algorithm=algorithm, algorithm_options=opts, bucket_mb=1e-4))
    return tr, model


def mlp_batch(comm, t, bad_rank=None):
    g = torch.Generator().manual_seed(100 * t + comm.Get_rank())
    x = torch.randn(4, 5, generator=g)
    if comm.Get_rank() == bad_rank:
        x[1, 2] = float("nan")
    return x, torch.randint(0, 3, (4,), generator=g)


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATS)
def test_nan_loss_on_one_rank_stops_every_rank_naming_it(strategy, closer):
    comm = MPI.COMM_WORLD
    bad = comm.Get_size() - 1
    tr, model = mlp_trainer(closer, comm, strategy)
    for t in range(2):
        tr.step(*mlp_batch(comm, t))
    before = [p.detach().clone() for p in model.parameters()]
    msg = error_on_every_rank(comm, lambda: tr.step(*mlp_batch(comm, 2, bad_rank=bad)))
    assert msg.startswith(f"step 2: non-finite loss on rank {bad}; stopped on every rank"), msg
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))     # the bad step changed nothing
    assert same_on_all_ranks(comm, list(model.parameters()))


@pytest.mark.mpi
def test_nan_gradient_with_finite_loss_on_one_rank_is_named(closer):
    comm = MPI.COMM_WORLD
    bad = comm.Get_size() // 2
    tr, model = mlp_trainer(closer, comm, "flat")
    hook = model[2].weight.register_hook(lambda g: g * float("nan")) if comm.Get_rank() == bad else None
    msg = error_on_every_rank(comm, lambda: tr.step(*mlp_batch(comm, 0)))
    assert msg.startswith(f"step 0: non-finite gradient (finite loss) on rank {bad};"), msg
    if hook:
        hook.remove()


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATS)
def test_odsgd_nan_on_one_rank_stops_every_rank_one_step_later(strategy, closer):
    comm = MPI.COMM_WORLD
    bad = comm.Get_size() - 1
    tr, model = mlp_trainer(closer, comm, strategy, algorithm="odsgd", warmup_steps=2)
    for t in range(4):
        tr.step(*mlp_batch(comm, t))
    tr.step(*mlp_batch(comm, 4, bad_rank=bad))          # the mean of step 4 is in flight
    msg = error_on_every_rank(comm, lambda: tr.step(*mlp_batch(comm, 5)))
    assert msg.startswith(f"step 4: non-finite loss on rank {bad};"), msg
    assert not tr.algo.in_flight                         # nothing left in flight on any rank
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert same_on_all_ranks(comm, list(model.parameters()))   # W, the same everywhere


# --- fp16 wire overflow of finite gradients --------------------------------------------------------
N_ELEMS = 70_000            # > 64 KiB: the bucket travels through the fp16 ring


def wire_setup(closer, comm, strategy, compression, lr=0.1):
    topo = closer(Topology.create(comm, ranks_per_node=1))     # one rank per node: hierarchical has a wire
    torch.manual_seed(0)
    model = torch.nn.Linear(N_ELEMS, 1, bias=False)
    comm_lib.broadcast_module(model, comm)
    sync = closer(comm_lib.create(strategy, model.parameters(), topo, compression=compression))
    return SSGD(model, torch.optim.SGD(model.parameters(), lr=lr), sync), model


def const_grad(model, g):
    """A finite loss whose gradient is ``g`` everywhere, on every rank."""
    return lambda: (model.weight * g).sum()


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATS)
def test_fp16_wire_overflow_skips_the_step_on_every_rank(strategy, closer):
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    if size == 1:
        pytest.skip("nothing crosses a wire on one rank")
    big = 1e5                                 # fits fp16 pre-divided, but the mean does not
    with np.errstate(over="ignore"):
        assert np.isfinite(np.float16(big / size)) and np.isinf(np.float16(big))
    algo, model = wire_setup(closer, comm, strategy, "fp16")
    w0 = model.weight.detach().clone()
    r = algo.step(const_grad(model, big))
    assert all(comm.allgather(r.skipped))
    assert torch.equal(model.weight, w0) and torch.isfinite(model.weight).all()
    # a clean step is applied: w - lr * mean, the mean within fp16 rounding
    r = algo.step(const_grad(model, 0.1))
    assert not any(comm.allgather(r.skipped))
    np.testing.assert_allclose(model.weight.detach().numpy(), w0.numpy() - 0.1 * 0.1, rtol=0,
                               atol=0.1 * 0.1 * (size + 1) * 2**-11 + 1e-7)   # one fp16 rounding per hop
    assert same_on_all_ranks(comm, [model.weight])
    # MAX_WIRE_SKIPS overflows in a row: the weights no longer move, the run stops everywhere
    for _ in range(MAX_WIRE_SKIPS - 1):
        assert algo.step(const_grad(model, big)).skipped
    msg = error_on_every_rank(comm, lambda: algo.step(const_grad(model, big)))
    assert f"overflowed in communication {MAX_WIRE_SKIPS} steps in a row" in msg
    assert torch.isfinite(model.weight).all()


@pytest.mark.mpi
def test_the_same_gradients_in_full_precision_are_applied(closer):
    comm = MPI.COMM_WORLD
    algo, model = wire_setup(closer, comm, "flat", "none")
    w0 = model.weight.detach().clone()
    assert not algo.step(const_grad(model, 1e5)).skipped
    np.testing.assert_allclose(model.weight.detach().numpy(), w0.numpy() - 0.1 * 1e5, rtol=1e-6)
