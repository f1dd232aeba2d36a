"""``comm.strategy = auto`` (the default): hierarchical where a node holds several ranks, flat
with one rank per node; ``describe()`` says what was chosen; per bucket the size rule picks
MPI's Iallreduce / Allreduce or the ring, the same on every rank."""
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer


@pytest.mark.mpi
@pytest.mark.parametrize("ranks_per_node", [1, 2])
def test_auto_chooses_by_ranks_per_node(ranks_per_node, closer):
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node=ranks_per_node))
    params = [torch.nn.Parameter(torch.zeros(1000))]
    sync = closer(comm_lib.create("auto", params, topo))
    several = max(topo.node_sizes) > 1
    assert sync.name == ("hierarchical" if several else "flat")
    line = sync.describe()
    assert line.startswith(f"{sync.name} (auto: ") and "gradients live in the buckets" in line
    params[0].grad = torch.full((1000,), float(comm.Get_rank()))
    assert sync.allreduce_grads() is False
    assert torch.allclose(params[0].grad, torch.tensor((comm.Get_size() - 1) / 2))


@pytest.mark.mpi
def test_the_trainer_default_is_auto(closer):
    topo = closer(Topology.create(MPI.COMM_WORLD))
    model = torch.nn.Linear(4, 2)
    tr = closer(DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), topo))
    assert "(auto: " in tr.grad_sync.describe()

