"""DistributedOptimizer and the broadcast helpers as Horovod's own tests use them: automatic
parameter names, option values and parameters without gradients through
``broadcast_optimizer_state``, and everything on a process set (a list of ranks, or an mpi4py
communicator each member passes)."""
import pytest
import torch
from mpi4py import MPI

import hpctrain.horovod.torch as hvd
from tests.mpi.horovod_session import hvd_on, world  # noqa: F401  (hvd_on: autouse fixture)
from tests.mpi.horovod_sets import sets  # noqa: F401  (fixture)

pytestmark = pytest.mark.mpi


def test_process_sets_from_communicators():
    """Each rank passes its own Split communicator: one set per group, each its own members'.
    (First in the module: before the ``sets`` fixture registers the halves, which at 2 ranks
    are these groups.)"""
    rank, size = world()
    if size == 1:
        pytest.skip("one rank: the only group is the job itself (already registered)")
    low = rank < (size + 1) // 2
    sub = MPI.COMM_WORLD.Split(0 if low else 1, key=rank)
    try:
        ps = hvd.add_process_set(hvd.ProcessSet(sub))
        mine = [r for r in range(size) if (r < (size + 1) // 2) == low]
        assert ps.ranks == mine and ps.included() and ps.rank() == mine.index(rank)
        out = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=ps)
        assert out.item() == sum(mine)
        assert hvd.remove_process_set(ps) and not ps.included()
    finally:
        sub.Free()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_without_named_parameters_names_are_unique_and_the_same_everywhere():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([{"params": model[0].parameters()},
                                                    {"params": model[1].parameters()}], lr=0.1))
    try:
        names = opt._parameter_names
        assert set(names) == set(model.parameters()) and len(set(names.values())) == 4
        everyone = hvd.allgather_object(sorted(names.values()))
        assert all(n == everyone[0] for n in everyone)
    finally:
        opt.close()


def test_broadcast_optimizer_state_carries_the_roots_options():
    """The root changed lr after building; the others see its value through the wrapper."""
    rank, size = world()
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    try:
        if rank == 0:
            for group in opt.param_groups:
                group["lr"] = 0.2
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert opt.param_groups[0]["lr"] == 0.2 and opt._inner.param_groups[0]["lr"] == 0.2
        model(torch.ones(1, 3)).sum().backward()
        opt.step()                                   # the loaded groups still train
    finally:
        opt.close()


def test_broadcast_optimizer_state_with_a_parameter_without_gradient():
    """As Horovod's test: the frozen parameter keeps grad None, the other gets a zero gradient
    (its first zero step), and that gradient can be broadcast."""
    frozen = torch.nn.Parameter(torch.ones(3, dtype=torch.float64), requires_grad=False)
    live = torch.nn.Parameter(torch.full((3,), 2.0, dtype=torch.float64))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([frozen, live], lr=0.001, momentum=0.9, nesterov=True,
                                                   weight_decay=1e-6),
                                   named_parameters=[("a", frozen), ("b", live)])
    try:
        hvd.broadcast_parameters([("a", frozen), ("b", live)], root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert opt.param_groups[0]["params"][0].grad is None
        grad = opt.param_groups[0]["params"][1].grad
        assert torch.equal(grad, torch.zeros(3, dtype=torch.float64))
        assert torch.equal(hvd.broadcast(grad, root_rank=0), grad)
    finally:
        opt.close()


def test_distributed_optimizer_on_a_process_set_averages_over_its_members(sets):
    rank, size = world()
    half = sets["half"]
    model = torch.nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), process_set=half)
    try:
        (model(torch.full((1, 2), float(rank), dtype=torch.float64)).sum()).backward()   # grad: rank
        opt.step()
        mean = sum(half.ranks) / half.size()
        assert torch.allclose(model.weight, torch.full((1, 2), 1.0 - mean, dtype=torch.float64))
    finally:
        opt.close()
    obj = hvd.broadcast_object({"from": rank}, root_rank=half.ranks[-1], process_set=half)
    assert obj == {"from": half.ranks[-1]}
    assert hvd.allgather_object(rank, process_set=half) == half.ranks
    w = torch.full((2,), float(rank))
    hvd.broadcast_parameters([("w", w)], root_rank=half.ranks[0], process_set=half)
    assert w.tolist() == [float(half.ranks[0])] * 2
    hvd.barrier(process_set=half)
