"""What a training step's gradient sync does per parameter, counted (not timed): no Python hook
during a blocking round's backward, no packer list for a full-precision bucket; and the probe
seam that the per-step budget uses changes no result."""
from __future__ import annotations

import functools

import pytest
import torch
from mpi4py import MPI

from hpctrain.comm.buckets import Bucket, make_buckets
from hpctrain.ops.budget import NULL_PROBE, PhaseBudget
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)


def test_a_blocking_round_leaves_no_tensor_hook_on_the_parameters():
    model = small_model()
    topo = Topology.create(MPI.COMM_SELF)
    trainer = DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), topo, strategy="flat")
    try:
        assert all(not p._backward_hooks for p in model.parameters())     # nothing before a step
        trainer.step(*batch())
        assert all(not p._backward_hooks for p in model.parameters())     # nor after one
    finally:
        trainer.close()
        topo.close()


def test_begin_guards_the_buckets_in_flight_until_finish():
    model = small_model()
    topo = Topology.create(MPI.COMM_SELF)
    trainer = DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), topo, strategy="flat")
    sync, (x, y) = trainer.grad_sync, batch()
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        own = [p.grad.clone() for p in model.parameters()]
        sync.begin()
        assert all(p._backward_hooks for p in model.parameters())
        torch.nn.functional.cross_entropy(model(x), y).backward()     # while in flight: private grads
        sync.finish(scatter=False)
        assert all(not p._backward_hooks for p in model.parameters())
        for p, g in zip(model.parameters(), own):
            torch.testing.assert_close(p.grad, 2 * g)                 # g1 + g2, the buffers untouched
    finally:
        trainer.close()
        topo.close()


def test_a_full_precision_bucket_gathers_without_making_views(monkeypatch):
    params = [torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(2, 3))]
    (bucket,) = make_buckets(params, 2**20)
    for p in params:
        p.grad = torch.randn_like(p)
    calls = []
    real = Bucket.segment
    monkeypatch.setattr(Bucket, "segment", lambda self, j, i: calls.append(i) or real(self, j, i))
    bucket.next_round()
    bucket.gather_grads()
    assert calls == []
    expected = torch.cat([p.grad.reshape(-1) for p in reversed(params)])    # last-defined first
    assert torch.equal(bucket.flat, expected)


def test_the_probe_changes_no_result_and_its_phases_add_up():
    out = []
    for probe in (NULL_PROBE, PhaseBudget()):
        model = small_model()
        topo = Topology.create(MPI.COMM_SELF)
        trainer = DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), topo,
                                     strategy="flat")
        trainer.grad_sync.probe = probe
        step = functools.partial(trainer.step, *batch())
        try:
            walls = [probe.step(step) if isinstance(probe, PhaseBudget) else step() for _ in range(3)]
        finally:
            trainer.close()
            topo.close()
        out.append([p.detach().clone() for p in model.parameters()])
        if isinstance(probe, PhaseBudget):
            totals = probe.reset()
            assert {("pack", 0), ("reduce.node", 0), ("unpack", 0)} <= set(totals)
            assert sum(totals.values()) == pytest.approx(sum(walls), rel=1e-9)
    assert all(torch.equal(a, b) for a, b in zip(*out))


def test_waiting_on_mpi_requests_gives_the_core_away_between_tests(monkeypatch):
    from hpctrain.comm import progress
    answers = iter([False, False, True])
    tested, yielded = [], []
    monkeypatch.setattr(progress, "test_all", lambda reqs: tested.append(list(reqs)) or next(answers))
    monkeypatch.setattr(progress.os, "sched_yield", lambda: yielded.append(1))
    req = MPI.COMM_SELF.Ibarrier()
    progress.wait_all([req])
    assert len(tested) == 3 and len(yielded) == 2     # tested until done, the core given up between
    req.Wait()
