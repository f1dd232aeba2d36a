"""The per-step budget on a real 2-rank trainer: the phases add up to the step, each strategy
shows its own phases per bucket, the floor's bytes and syncs match a count made here from the
parameters, and the instrument changes no result. Bookkeeping only: nothing is timed against a
bound."""
import pytest
import torch
from mpi4py import MPI

from hpctrain.ops.budget import NULL_PROBE
from hpctrain.tools.bench.budget import measure_budget
from hpctrain.tools.bench.step import make_data, make_model, sgd
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

STEPS = 2


def trainer_of(strategy, topo, closer):
    torch.manual_seed(0)
    model = make_model("digits_cnn")
    opt = sgd(model)
    return closer(DistributedTrainer(model, opt, topo, strategy=strategy, bucket_mb=0.25, tune="static")), opt


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", ["hierarchical", "flat"])
def test_budget_adds_up_and_the_floor_counts_the_strategys_bytes(strategy, closer):
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm))
    trainer, opt = trainer_of(strategy, topo, closer)
    data = make_data("digits_cnn", 4, comm.Get_rank())
    b = measure_budget(comm, trainer, opt, data, STEPS)
    phases = b["phases_ms"]
    assert sum(phases.values()) == pytest.approx(b["step_ms"], rel=1e-9)       # exclusive: nothing twice
    assert b["residual_ms"] == pytest.approx(phases.get("other", 0.0), abs=1e-9)
    assert {"forward", "backward", "zero_grad", "optimizer", "check", "pack", "unpack", "reduce.node"} <= set(phases)
    n_buckets = len(trainer.grad_sync.buckets)
    assert n_buckets > 1 and sorted(b["buckets_ms"]) == list(range(n_buckets))
    if strategy == "hierarchical":              # its node barriers are its waits
        assert all("wait" in row for row in b["buckets_ms"].values())
    grad_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    n = comm.Get_size()
    f = b["floor"]
    assert f["gradient_bytes"] == grad_bytes
    expected = grad_bytes if strategy == "hierarchical" else 3.5 * (n - 1) / n * grad_bytes
    assert f["bytes_moved"] == pytest.approx(expected)
    assert f["syncs"] == (2 if strategy == "hierarchical" else 1) * n_buckets
    assert f["floor_ms"] == pytest.approx(f["compute_ms"] + f["transfer_ms"] + f["sync_ms"])
    compute = sum(phases[k] for k in ("zero_grad", "forward", "backward", "optimizer"))
    assert f["compute_ms"] == pytest.approx(compute)
    assert trainer.grad_sync.probe is NULL_PROBE


@pytest.mark.mpi
def test_the_instrument_changes_no_result(closer):
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm))
    plain, _ = trainer_of("auto", topo, closer)
    timed, timed_opt = trainer_of("auto", topo, closer)
    x, y = make_data("digits_cnn", 4, comm.Get_rank())
    for _ in range(STEPS):
        plain.step(x, y)
    measure_budget(comm, timed, timed_opt, (x, y), STEPS)
    for p, q in zip(plain.model.parameters(), timed.model.parameters()):
        assert torch.equal(p, q)
