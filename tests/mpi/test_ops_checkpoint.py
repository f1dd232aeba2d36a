"""Collective checkpoint save/resume and the merged timeline, across ranks.

``mpiexec -n 2 .venv/bin/python -m pytest --only-mpi --color=no tests/mpi/test_ops_checkpoint.py``
(also at -n 4).
"""
import json
import os

import numpy as np
import pytest
import torch
from mpi4py import MPI
from torch import nn

from hpctrain.ops import checkpoint as ck
from hpctrain.errors import UserError
from hpctrain.optim.loss_scale import LossScaler
from hpctrain.ops.timeline import Timeline, merge_and_write
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

torch.set_num_threads(1)


def shared_dir(world, tmp_path):
    return world.bcast(str(tmp_path), root=0)


def make_trainer(topo, width=8, seed=0, **kw):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return DistributedTrainer(model, opt, topo, scaler=LossScaler(init_scale=256.0, growth_interval=2), **kw)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)


@pytest.mark.mpi(min_size=2)
def test_save_then_resume_restores_everything(world, tmp_path, closer):
    d = shared_dir(world, tmp_path)
    topo = closer(Topology.create(world))
    rank = world.Get_rank()
    a = closer(make_trainer(topo))
    for s in range(5):
        a.step(*batch(rank, s))
    ckpt = ck.Checkpointer(world, d, steps_per_epoch=3, global_batch=8 * world.Get_size(), config={"x": 1})
    torch.manual_seed(100 + rank)                 # a different RNG stream on every rank
    np.random.seed(200 + rank)
    path = ckpt.save(a)
    expect_rng = (torch.rand(2), np.random.rand(2))
    assert path == os.path.join(d, ck.checkpoint_name(5)) and os.path.exists(path)

    b = closer(make_trainer(topo, seed=7))        # different initial weights
    torch.manual_seed(0), np.random.seed(0)
    pos = ck.Checkpointer(world, d, steps_per_epoch=3, global_batch=8 * world.Get_size(), config={}).resume(b, "auto")
    assert (pos.step, pos.epoch, pos.step_in_epoch, pos.replanned) == (5, 1, 2, False)
    assert b.step_count == 5
    # Parameters are identical on every rank; BN running statistics are each rank's own (local
    # batches), and the checkpoint holds rank 0's, which every rank loads.
    ref = world.bcast({k: v.clone() for k, v in a.model.state_dict().items()} if rank == 0 else None, root=0)
    for k, vb in b.model.state_dict().items():
        assert torch.equal(ref[k], vb), k
    for (k, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(pa, pb), k
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i]["momentum_buffer"], sb[i]["momentum_buffer"]) for i in sa)
    assert b.algo.scaler.state_dict() == a.algo.scaler.state_dict()
    got_rng = (torch.rand(2), np.random.rand(2))  # each rank got its own stream back
    assert torch.equal(got_rng[0], expect_rng[0]) and np.array_equal(got_rng[1], expect_rng[1])
    # and training continues identically
    a.step(*batch(rank, 5))
    b.step(*batch(rank, 5))
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))


@pytest.mark.mpi(min_size=2)
def test_mid_run_checkpoint_of_odsgd_completes_the_update_in_flight(world, tmp_path, closer):
    d = shared_dir(world, tmp_path)
    topo = closer(Topology.create(world))
    a = closer(make_trainer(topo, algorithm="odsgd", algorithm_options={"warmup_steps": 1}))
    saver = ck.Checkpointer(world, d, steps_per_epoch=4, global_batch=8, config={})
    for s in range(3):
        a.step(*batch(world.Get_rank(), s))
    with pytest.raises(RuntimeError, match="in flight"):
        a.state_dict()                            # past warm-up: a global update is in flight
    saver.save(a)
    b = closer(make_trainer(topo, seed=5, algorithm="odsgd", algorithm_options={"warmup_steps": 1}))
    ck.Checkpointer(world, d, steps_per_epoch=4, global_batch=8, config={}).resume(b, "auto")
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    for s in range(3, 5):                         # both go on from the same synchronised point
        a.step(*batch(world.Get_rank(), s))
        b.step(*batch(world.Get_rank(), s))
    a.finish(), b.finish()
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))


@pytest.mark.mpi(min_size=2)
def test_resume_refuses_another_model_on_every_rank(world, tmp_path, closer):
    d = shared_dir(world, tmp_path)
    topo = closer(Topology.create(world))
    a = closer(make_trainer(topo))
    ck.Checkpointer(world, d, steps_per_epoch=3, global_batch=8, config={}).save(a)
    b = closer(make_trainer(topo, width=6))
    with pytest.raises(UserError, match=r"was written for a different model: this run has '0.weight \(6, 4\)"):
        ck.Checkpointer(world, d, steps_per_epoch=3, global_batch=8, config={}).resume(b, "auto")


@pytest.mark.mpi(min_size=2)
def test_resume_auto_skips_corrupt_newest_and_explicit_bad_path_fails(world, tmp_path, closer):
    d = shared_dir(world, tmp_path)
    topo = closer(Topology.create(world))
    a = closer(make_trainer(topo))
    saver = ck.Checkpointer(world, d, steps_per_epoch=10, global_batch=8, config={}, keep=5)
    a.step(*batch(0, 0))
    good = saver.save(a)
    a.step(*batch(0, 1))
    bad = saver.save(a)
    if world.Get_rank() == 0:
        with open(bad, "r+b") as fh:
            fh.seek(-3, os.SEEK_END)
            fh.write(b"xyz")
    world.Barrier()
    b = closer(make_trainer(topo, seed=3))
    pos = ck.Checkpointer(world, d, steps_per_epoch=10, global_batch=8, config={}).resume(b, "auto")
    assert pos.step == 1 and b.step_count == 1
    assert not os.path.exists(bad) and os.path.exists(bad + ".corrupt")     # set aside, never deleted
    with pytest.raises(UserError, match="SHA-256 mismatch"):
        ck.Checkpointer(world, d, steps_per_epoch=10, global_batch=8, config={}).resume(b, bad + ".corrupt")
    assert ck.Checkpointer(world, d + "/none", steps_per_epoch=10, global_batch=8, config={}).resume(b, "auto") is None
    assert good.endswith(ck.checkpoint_name(1))


@pytest.mark.mpi(min_size=2)
def test_merged_timeline_has_every_rank(world, tmp_path):
    d = shared_dir(world, tmp_path)
    rank, size = world.Get_rank(), world.Get_size()
    tl = Timeline(world, max_events=5)
    for i in range(3 + rank):                     # rank r records 3 + r spans (over the cap for big r)
        tl("forward", tl.t0 + 0.001 * i, 0.0005)
    path = merge_and_write(tl, world, os.path.join(d, "timeline.json"))
    world.Barrier()
    if rank == 0:
        trace = json.load(open(path))             # valid JSON in the Trace Event Format
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        for r in range(size):
            mine = [e for e in spans if e["pid"] == r]
            assert len(mine) == min(3 + r, 5)
            assert [e["ts"] for e in mine] == pytest.approx([1000.0 * i for i in range(len(mine))])
            assert all(e["dur"] == pytest.approx(500.0) for e in mine)
        names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
        assert names == {r: f"rank {r}" for r in range(size)}
        dropped = {e["pid"]: e["args"]["dropped"] for e in trace["traceEvents"] if e["name"] == "events dropped"}
        assert dropped == {r: 3 + r - 5 for r in range(size) if 3 + r > 5}
        assert trace["otherData"]["world_size"] == size
    else:
        assert path is None
    MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi(min_size=2)
def test_a_resume_from_older_work_branches_into_a_new_leg(world, tmp_path, closer):
    """Resuming (by path) from a checkpoint older than the run's newest work must neither write
    over the later checkpoints of the same step nor rank below them: it starts a new leg."""
    d = shared_dir(world, tmp_path)
    topo = closer(Topology.create(world))
    a = closer(make_trainer(topo))
    saver = ck.Checkpointer(world, d, steps_per_epoch=10, global_batch=8, config={}, keep=10, run_id="r")
    paths = []
    for s in range(3):
        a.step(*batch(world.Get_rank(), s))
        paths.append(saver.save(a))
    before = world.bcast(open(paths[1], "rb").read() if world.Get_rank() == 0 else None, root=0)
    b = closer(make_trainer(topo, seed=3))
    again = ck.Checkpointer(world, d, steps_per_epoch=10, global_batch=8, config={}, keep=10, run_id="r")
    assert again.resume(b, paths[0]).step == 1 and again.leg == 1
    b.step(*batch(world.Get_rank(), 1))
    branch = again.save(b)
    assert os.path.basename(branch) == "ckpt-000000002-leg1.pt"
    world.Barrier()
    assert open(paths[1], "rb").read() == before                    # leg 0's step 2 untouched
    assert ck.newest_valid(d, run_id="r")[0] == branch               # the branch is the newest work
    header = ck.read_header(branch)
    assert header["leg"] == 1 and header["samples_seen"] == 2 * 8
    world.Barrier()
