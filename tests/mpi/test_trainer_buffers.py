"""BatchNorm buffers across ranks, and ``train.run`` releasing what it opened on every exit.

Buffers are no gradients: each rank's running statistics follow its own batches. The trainer
makes them rank 0's in ``finish()`` (before evaluation and checkpoints) or, DDP-style, before
every forward (``broadcast_buffers="forward"``).

``mpiexec -n 2 .venv/bin/python -m pytest --only-mpi --color=no tests/mpi/test_trainer_buffers.py``
"""
import gc
import os
import threading

import h5py
import pytest
import torch
from mpi4py import MPI
from torch import nn

from hpctrain.job.config import Config
from hpctrain.errors import UserError
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

torch.set_num_threads(1)


def bn_trainer(topo, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    return DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), topo, **kw)


def rank_batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 4, generator=g) * (1 + rank), torch.randint(0, 3, (8,), generator=g)


def buffers(model):
    return [b.clone() for b in model.buffers()]


@pytest.mark.mpi
def test_finish_makes_every_rank_hold_rank0s_buffers(closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    topo = closer(Topology.create(comm))
    tr = closer(bn_trainer(topo))
    for step in range(3):
        tr.step(*rank_batch(rank, step))
    mine = buffers(tr.model)
    everyone = comm.allgather([b.numpy() for b in mine])
    if size > 1:                                       # different data: the statistics drifted apart
        assert not torch.equal(torch.from_numpy(everyone[0][0]), torch.from_numpy(everyone[1][0]))
    tr.finish()
    for got, want in zip(buffers(tr.model), everyone[0]):
        assert torch.equal(got, torch.from_numpy(want))


@pytest.mark.mpi
def test_evaluation_scores_the_same_model_everywhere(closer):
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    topo = closer(Topology.create(comm))
    tr = closer(bn_trainer(topo))
    tr.step(*rank_batch(rank, 0))
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(7))    # the same input on every rank
    with tr.evaluation() as model, torch.no_grad():
        assert not model.training
        out = model(x)
    assert tr.model.training                                             # restored
    outs = comm.allgather(out.numpy())
    assert all((o == outs[0]).all() for o in outs)


@pytest.mark.mpi
def test_forward_mode_broadcasts_before_every_forward(closer):
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    topo = closer(Topology.create(comm))
    tr = closer(bn_trainer(topo, broadcast_buffers="forward"))
    seen = []
    tr.model.register_forward_pre_hook(lambda m, args: seen.append([b.numpy().copy() for b in buffers(m)]))
    for step in range(3):
        tr.step(*rank_batch(rank, step))
    assert len(seen) == 3
    for k, mine in enumerate(seen):                    # what each forward started from: rank 0's
        root = comm.bcast(mine if rank == 0 else None, root=0)
        assert all((a == b).all() for a, b in zip(mine, root)), k


def test_unknown_buffer_mode_is_refused():
    topo = Topology.create(MPI.COMM_SELF)
    try:
        with pytest.raises(ValueError, match="broadcast_buffers: unknown 'always'"):
            bn_trainer(topo, broadcast_buffers="always")
    finally:
        topo.close()


def open_hdf5_files() -> int:
    """After a collection: an earlier test's file that only waits for the garbage collector
    (a reference cycle) would otherwise be counted before a run and closed during it."""
    gc.collect()
    return h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)


def hpctrain_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("hpctrain"))


@pytest.fixture
def small_run(digits_dir, tmp_path):
    comm = MPI.COMM_WORLD
    cfg = Config()
    cfg.data.cache_dir = os.path.dirname(digits_dir)
    cfg.run.run_dir = comm.bcast(str(tmp_path), root=0)
    cfg.run.progress = False
    cfg.train.max_steps = 2
    return cfg


@pytest.mark.mpi
def test_run_releases_files_and_threads_on_success_and_on_agreed_errors(small_run):
    """``study`` calls ``run`` several times in one process: nothing may pile up."""
    from hpctrain.job import run
    comm = MPI.COMM_WORLD
    files, threads, comms = open_hdf5_files(), hpctrain_threads(), MPI.COMM_WORLD.Get_size()
    summary = run(small_run, comm)
    assert summary["steps"] == 2
    assert (open_hdf5_files(), hpctrain_threads()) == (files, threads)
    small_run.ckpt.resume = os.path.join(small_run.run.run_dir, "missing.pt")   # fails after set-up
    with pytest.raises(UserError, match="missing.pt"):
        run(small_run, comm)
    assert (open_hdf5_files(), hpctrain_threads()) == (files, threads)
    assert comm.Get_size() == comms
