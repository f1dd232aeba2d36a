"""The library API: a user's own model through DistributedTrainer on N ranks equals one process
training on the N× global batch, for SGD and for LARS (the Foundation equivalence, via the API)."""
import pytest
import torch
from mpi4py import MPI

import hpctrain

STEPS, PER_RANK = 4, 3


class UserNet(torch.nn.Module):
    """A model hpctrain has never seen: 1-D inputs, two layers with biases."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 16)
        self.fc2 = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def batches(world):
    g = torch.Generator().manual_seed(99)
    for _ in range(STEPS):
        yield (torch.randn(world * PER_RANK, 12, generator=g, dtype=torch.float64),
               torch.randint(0, 5, (world * PER_RANK,), generator=g))


def build(optimizer):
    torch.manual_seed(3)
    model = UserNet().double()
    own = {"eta": 0.01} if optimizer == "lars" else {}          # an option sgd does not take is refused
    opt = hpctrain.make_optimizer(model, optimizer, lr=0.05, momentum=0.9, weight_decay=1e-3, **own)
    return model, opt


@pytest.mark.mpi
@pytest.mark.parametrize("optimizer", ["sgd", "lars"])
def test_api_equals_single_process(optimizer, closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    topo = closer(hpctrain.init(comm, abort_on_error=False))
    model, opt = build(optimizer)
    spec = hpctrain.ScheduleSpec(peak_lr=0.05, warmup_steps=2, total_steps=STEPS, kind="cosine")
    trainer = closer(hpctrain.DistributedTrainer(model, opt, topo, schedule=spec))
    for x, y in batches(size):
        sl = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        trainer.step(x[sl], y[sl])

    ref, ref_opt = build(optimizer)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(batches(size)):
        for g in ref_opt.param_groups:
            g["lr"] = hpctrain.lr_at(step, spec)
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()
    with torch.no_grad():
        diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
    assert diff <= 1e-10, diff


@pytest.mark.mpi
def test_allreduce_metrics_and_broadcast():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    out = hpctrain.allreduce_metrics({"loss": rank, "n": 1}, comm)
    assert out == {"loss": (size - 1) / 2, "n": 1.0}
    assert hpctrain.allreduce_metrics({"n": 2}, comm, average=False) == {"n": 2.0 * size}
    torch.manual_seed(rank)
    m = UserNet()
    hpctrain.broadcast_parameters(m, comm)
    assert len(set(comm.allgather(float(m.fc1.weight.sum())))) == 1


@pytest.mark.mpi
def test_physical_local_rank_ignores_emulated_nodes(closer):
    """ranks_per_node=1 makes every rank local rank 0 of its own emulated node; the rank on the
    physical host (what GPU binding uses) is the shared-memory split's, as without emulation."""
    from hpctrain.topology import Topology
    comm = MPI.COMM_WORLD
    real = closer(Topology.create(comm))
    emulated = closer(Topology.create(comm, ranks_per_node=1))
    assert emulated.local_rank == 0 and emulated.emulated
    assert emulated.physical_local_rank == real.local_rank == real.physical_local_rank
    assert sorted(comm.allgather(emulated.physical_local_rank)) == list(range(real.local_size))
