"""comm.tune = measure: each flat bucket takes whichever of MPI's allreduce and the ring its
timing says, every rank the same, and the result is MPI's Allreduce either way."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.comm import tuner
from hpctrain.comm.ring import SMALL_BYTES
from hpctrain.topology import Topology

SIZES = [300_000, 70_000, 300_000, 5]          # two equal ring-sized buckets, one mid, one small


@pytest.fixture
def topo(closer):
    return closer(Topology.create(MPI.COMM_WORLD))


def assert_syncs_to_mpi_mean(params, sync, comm):
    """One round on random per-rank gradients gives MPI's Allreduce / n (fp32 sums in another
    order: 1e-5 absolute on N(0, 1) data)."""
    rng = np.random.default_rng(comm.Get_rank())
    grads = [torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for n in SIZES]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    assert sync.allreduce_grads() is False
    for p, g in zip(params, grads):
        ref = g.double().numpy().copy()
        comm.Allreduce(MPI.IN_PLACE, ref)
        np.testing.assert_allclose(p.grad.numpy(), ref / comm.Get_size(), rtol=0, atol=1e-5)


def flat(topo, closer, **kw):
    params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    sync = closer(comm_lib.create("flat", params, topo, bucket_bytes=300_000 * 4, **kw))
    return params, sync


@pytest.mark.mpi
@pytest.mark.parametrize("faster", ["mpi", "ring"])
def test_the_faster_method_is_chosen_and_measured_once_per_size(faster, topo, closer, monkeypatch):
    calls = []

    def fake(comm, src, dst, codec, scale, blocking, trials=tuner.TRIALS):
        calls.append((src.numel(), blocking))
        return {"mpi": 1.0, "ring": 2.0} if faster == "mpi" else {"mpi": 2.0, "ring": 1.0}
    monkeypatch.setattr(tuner, "measured", fake)
    _, sync = flat(topo, closer, tune="measure")
    sizes = [b.n_elems for b in sync.buckets]
    methods = [r.method for r in sync._rings]
    if topo.comm.Get_size() == 1:
        assert calls == []
        return
    # the small bucket is never measured (MPI's); equal sizes are measured once, blocking
    assert sorted(calls) == sorted({(n, True) for n in sizes if n * 4 > SMALL_BYTES})
    assert methods == [faster if n * 4 > SMALL_BYTES else "mpi" for n in sizes]
    measured = {n * 4 for n in sizes if n * 4 > SMALL_BYTES}
    assert sync.measured == {b: faster for b in measured}
    assert f"{len(measured)} size(s) measured" in sync.describe()


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [False, True])
def test_measured_choice_agrees_on_every_rank_and_equals_mpi(overlap, topo, closer):
    comm = topo.comm
    params, sync = flat(topo, closer, tune="measure", overlap=overlap)
    methods = [r.method for r in sync._rings]
    assert comm.allgather(methods) == [methods] * comm.Get_size()
    assert_syncs_to_mpi_mean(params, sync, comm)


def test_unknown_tune_is_refused():
    with pytest.raises(ValueError, match="comm.tune: unknown 'fast'"):
        tuner.check_tune("fast")


@pytest.mark.mpi
def test_hierarchical_measures_its_inter_node_slices_and_equals_mpi(closer):
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node=max(1, comm.Get_size() // 2)))
    params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    sync = closer(comm_lib.create("hierarchical", params, topo, bucket_bytes=300_000 * 4, tune="measure"))
    if topo.n_nodes > 1:
        # every slice above the small-message size was measured, and a slice's method is the
        # same on every node (the ranks of one inter-node communicator)
        assert sync.measured
        methods = [r.method if r else None for r in sync._rings]
        peers = topo.inter.allgather(methods)
        assert peers == [methods] * topo.inter.Get_size()
    assert_syncs_to_mpi_mean(params, sync, comm)
