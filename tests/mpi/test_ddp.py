"""hpctrain.ddp: torch.distributed from the MPI launch, and DDP trained through hpctrain's hook.

References: MPI's own Allreduce (the process group is usable), DDP's default gloo allreduce (the
hook is a drop-in) and one process holding the global batch (the maths). fp32: the means differ
from those by summation order only; fp16: within the wire's rounding, and *not* bit-equal to
fp32 (so compression really ran).
"""
import copy
import datetime
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hpctrain.ddp
from hpctrain.ddp.process_group import RendezvousError, _export_ranks, open_store
from hpctrain.topology import Topology

pytestmark = pytest.mark.mpi(min_size=2)

STEPS, LR, BATCH = 3, 0.1, 4          # per-rank batch
BUCKET_MB = 0.1                       # several DDP buckets, some above fp16's 64 KiB threshold


@pytest.fixture(scope="module")
def pg():
    """The process group for the whole file, without MASTER_ADDR/MASTER_PORT."""
    saved = {k: os.environ.pop(k) for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    hpctrain.ddp.init_process_group()
    yield hpctrain.ddp.topology()
    hpctrain.ddp.destroy_process_group()
    os.environ.update(saved)


def make_model():
    torch.manual_seed(0)     # 75 268 parameters: 2 DDP buckets of 0.1 MB cap (66 820, 8 448 elements)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))


def global_batches(n_ranks, steps=STEPS, micro=1):
    g = torch.Generator().manual_seed(7)
    return [[(torch.randn(n_ranks * BATCH, 32, generator=g), torch.randint(0, 4, (n_ranks * BATCH,), generator=g))
             for _ in range(micro)] for _ in range(steps)]


def mine(batch, rank):
    x, y = batch
    return x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH]


def train_ddp(model, batches, rank, closer, hook=None, **ddp_kwargs):
    """SGD through DDP; ``hook``: HookState options (None: DDP's default allreduce). Every
    micro-batch but the last of a step runs under ``no_sync()``."""
    ddp = DDP(model, bucket_cap_mb=BUCKET_MB, **ddp_kwargs)
    state = closer(hpctrain.ddp.register(ddp, **hook)) if hook is not None else None
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for micro in batches:
        opt.zero_grad()
        for k, batch in enumerate(micro):
            x, y = mine(batch, rank)
            if k < len(micro) - 1:
                with ddp.no_sync():
                    nn.functional.cross_entropy(ddp(x), y).backward()
            else:
                nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return ddp.module, state


def train_one_process(model, batches):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for micro in batches:
        opt.zero_grad()
        for x, y in micro:
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def max_change(a, start):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), start.parameters()))


def test_init_needs_no_master_addr(pg):
    comm = MPI.COMM_WORLD
    assert "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ
    assert (dist.get_rank(), dist.get_world_size()) == (comm.Get_rank(), comm.Get_size())
    assert dist.get_backend() == "gloo"
    assert os.environ["RANK"] == str(comm.Get_rank()) and os.environ["LOCAL_RANK"] == str(pg.local_rank)
    mine_ = np.array([comm.Get_rank() + 1.0, 2.0 ** comm.Get_rank()])
    expected = np.empty_like(mine_)
    comm.Allreduce(mine_, expected)
    t = torch.from_numpy(mine_.copy())
    dist.all_reduce(t)
    assert t.tolist() == expected.tolist()


def test_bad_rendezvous_address_is_one_line_on_every_rank(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    comm = MPI.COMM_WORLD.Dup()
    try:
        with pytest.raises(RendezvousError) as err:
            open_store(comm, datetime.timedelta(seconds=5))
    finally:
        comm.Free()
    text = str(err.value)
    assert "no-such-host.invalid" in text and "\n" not in text


def test_bad_master_port_is_one_line_on_every_rank(monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "http")
    comm = MPI.COMM_WORLD.Dup()
    try:
        with pytest.raises(RendezvousError, match="MASTER_PORT='http'"):
            open_store(comm, datetime.timedelta(seconds=5))
    finally:
        comm.Free()


@pytest.mark.parametrize("strategy", ["auto", "flat", "hierarchical"])
@pytest.mark.parametrize("ddp_kwargs", [{}, {"gradient_as_bucket_view": True}, {"static_graph": True},
                                        {"find_unused_parameters": True}],
                         ids=["default", "bucket_view", "static_graph", "find_unused"])
def test_hook_equals_ddp_allreduce_and_one_process(pg, closer, strategy, ddp_kwargs):
    rank, n = pg.rank, pg.size
    batches = global_batches(n)
    start = make_model()
    ours, state = train_ddp(copy.deepcopy(start), batches, rank, closer, hook={"strategy": strategy},
                            **ddp_kwargs)
    theirs, _ = train_ddp(copy.deepcopy(start), batches, rank, closer, **ddp_kwargs)
    single = train_one_process(copy.deepcopy(start), batches)
    assert state.steps == STEPS and len(state._grad_syncs) == 2      # the hook ran, on both buckets
    scale = max_change(single, start)
    assert max_diff(ours, theirs) <= 1e-5 * scale + 1e-7
    assert max_diff(ours, single) <= 1e-5 * scale + 1e-7
    if strategy == "hierarchical" or (strategy == "auto" and pg.local_size > 1):
        assert all(s.name == "hierarchical" for s in state._grad_syncs.values())


def emulated_nodes(comm, closer):
    """Two emulated nodes (one rank each at -n 2, two at -n 4): the hierarchical sync's second
    level crosses them, where fp16 travels."""
    topo = closer(Topology.create(comm, max(1, comm.Get_size() // 2)))
    assert topo.n_nodes == 2
    return topo


@pytest.mark.parametrize("strategy", ["flat", "hierarchical"])
@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_emulated_nodes_and_fp16(pg, closer, strategy, compression):
    rank, n = pg.rank, pg.size
    batches = global_batches(n)
    start = make_model()
    topo = emulated_nodes(MPI.COMM_WORLD, closer) if strategy == "hierarchical" else None
    options = {"strategy": strategy, "compression": compression, "topology": topo}
    ours, state = train_ddp(copy.deepcopy(start), batches, rank, closer, hook=options)
    single = train_one_process(copy.deepcopy(start), batches)
    assert state.steps == STEPS
    if topo is not None:
        assert all(s._rings[s.buckets[0].index] is not None for s in state._grad_syncs.values()
                   if topo.local_rank < s._n_slices)              # a level across nodes
    scale, diff = max_change(single, start), max_diff(ours, single)
    if compression == "none":
        assert diff <= 1e-5 * scale + 1e-7
    else:   # a few fp16 roundings ((n+1) 2^-11 relative) per step, compounded over the steps
        assert 0 < diff <= STEPS * (n + 1) * 2.0**-11 * scale


def test_no_sync_accumulates_like_one_process(pg, closer):
    rank, n = pg.rank, pg.size
    batches = global_batches(n, micro=3)
    start = make_model()
    ours, state = train_ddp(copy.deepcopy(start), batches, rank, closer, hook={})
    single = train_one_process(copy.deepcopy(start), batches)
    assert state.steps == STEPS                   # one reduction per step, none per no_sync pass
    assert max_diff(ours, single) <= 1e-5 * max_change(single, start) + 1e-7


def test_model_differing_between_ranks_is_one_line(pg):
    width = 8 if pg.rank == 0 else 9
    with pytest.raises(hpctrain.ddp.HookStateError, match=r"rank\(s\) 1"):
        hpctrain.ddp.HookState(nn.Linear(4, width))


def test_half_parameters_on_one_rank_are_one_line_on_every_rank(pg):
    model = nn.Linear(4, 4)
    if pg.rank == 0:
        model.half()
    with pytest.raises(hpctrain.ddp.HookStateError, match=r"rank\(s\) 0: .*float16"):
        hpctrain.ddp.HookState(model)


def test_torchrun_rank_on_one_rank_is_one_line_on_every_rank(pg, monkeypatch):
    if pg.rank == pg.size - 1:
        monkeypatch.setenv("RANK", "99")
    with pytest.raises(RendezvousError, match=f"RANK=99 .* MPI says {pg.size - 1} on rank {pg.size - 1}"):
        _export_ranks(pg)


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_staged_buckets_as_on_a_gpu(pg, closer, monkeypatch, compression):
    """HPCTRAIN_TEST_STAGING routes the hook's CPU buckets through the device path (device
    buffers staged to host memory around each reduction), the path CUDA buckets take."""
    monkeypatch.setenv("HPCTRAIN_TEST_STAGING", "1")
    rank, n = pg.rank, pg.size
    batches = global_batches(n)
    start = make_model()
    ours, state = train_ddp(copy.deepcopy(start), batches, rank, closer,
                            hook={"strategy": "flat", "compression": compression})
    single = train_one_process(copy.deepcopy(start), batches)
    assert all(s.buckets[0].staging is not None for s in state._grad_syncs.values())
    scale, diff = max_change(single, start), max_diff(ours, single)
    assert diff <= (1e-5 * scale + 1e-7 if compression == "none" else STEPS * (n + 1) * 2.0**-11 * scale)
