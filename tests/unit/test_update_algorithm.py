"""The shape every update algorithm shares (hpctrain.update.base): what ``trainer.close()`` removes,
and the overflow / loss-scaler skip, identical for SSGD and OD-SGD, against the scaler's maths."""
import pytest
import torch
from mpi4py import MPI

from hpctrain import update as update_lib
from hpctrain.optim.loss_scale import LossScaler, next_scale
from hpctrain.update import NonFiniteError, UpdateAlgorithm
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

DIM = 4


def half_mse(out, y):
    return 0.5 * ((out.squeeze(1) - y) ** 2).mean()


def model_and_batch():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 3), torch.nn.Linear(3, 1)).double()
    g = torch.Generator().manual_seed(4)
    return model, torch.randn(6, DIM, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)


def trainer(model, algorithm, topo, **kw):
    opts = {"warmup_steps": 0} if algorithm == "odsgd" else {}
    return DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), topo, algorithm=algorithm,
                              algorithm_options=opts, **kw)


class CountingSync:
    """Stands in for the gradient sync: counts the polls OD-SGD's hooks make."""

    def __init__(self):
        self.polls = 0

    def poll(self):
        self.polls += 1
        return True


def test_every_algorithm_is_an_update_algorithm():
    assert all(issubclass(cls, UpdateAlgorithm) for cls in update_lib.ALGORITHMS.values())


def test_trainer_close_removes_odsgd_hooks_and_closes_the_sync():
    model, x, y = model_and_batch()
    topo = Topology.create(MPI.COMM_SELF)
    tr = trainer(model, "odsgd", topo, loss_fn=half_mse)
    for _ in range(2):
        tr.step(x, y)
    algo, sync = tr.algo, tr.grad_sync
    assert algo.in_flight
    tr.finish()

    def backward_polls() -> int:
        """Forward/backward with a round 'in flight': how often OD-SGD's hooks poll."""
        counter = CountingSync()
        algo.grad_sync, algo._round = counter, object()
        try:
            model.zero_grad()
            half_mse(model(x), y).backward()
        finally:
            algo.grad_sync, algo._round = sync, None
        return counter.polls

    assert backward_polls() > 0                 # the hooks are there while the trainer is open
    tr.close()
    assert sync.closed
    assert backward_polls() == 0                # ... and gone after close
    assert all(not m._forward_pre_hooks for m in model.modules())
    assert all(not p._post_accumulate_grad_hooks and not p._backward_hooks for p in model.parameters())
    tr.close()                                  # idempotent
    topo.close()


def scaler():
    return LossScaler(init_scale=2.0**10, growth_interval=3)


def expected_scaler(flags):
    """The scaler's own maths over the agreed overflow flags, from a fresh scaler."""
    ref = scaler()
    scale, good = ref.scale, 0
    for f in flags:
        scale, good = next_scale(scale, good, f, growth_interval=ref.growth_interval,
                                 growth_factor=ref.growth_factor, backoff_factor=ref.backoff_factor,
                                 min_scale=ref.min_scale, max_scale=ref.max_scale)
    return scale, good, sum(flags)


def run(algorithm, bad_step, steps, **kw):
    """``steps`` steps whose loss is inf at ``bad_step``; returns (skipped flags, global weights
    after each step, optimiser steps taken, the trainer's scaler)."""
    model, x, y = model_and_batch()
    topo = Topology.create(MPI.COMM_SELF)
    bad = [False]

    def loss_fn(out, target):
        return half_mse(out, target) * (float("inf") if bad[0] else 1.0)

    tr = trainer(model, algorithm, topo, loss_fn=loss_fn, **kw)
    n_opt = [0]
    tr.optimizer.register_step_post_hook(lambda *_: n_opt.__setitem__(0, n_opt[0] + 1))
    skipped, weights = [], []
    try:
        for t in range(steps):
            bad[0] = t == bad_step
            skipped.append(tr.step(x, y).skipped)
            glob = tr.algo.global_weights() if algorithm == "odsgd" else [p.detach() for p in model.parameters()]
            weights.append([w.clone() for w in glob])
        tr.finish()
    finally:
        tr.close()
        topo.close()
    return skipped, weights, n_opt[0], tr.algo.scaler


def test_overflow_skip_is_the_same_for_ssgd_and_odsgd():
    steps, bad = 4, 1
    flags = [t == bad for t in range(steps)]       # the agreed flag of each step's mean
    want = expected_scaler(flags)
    s_skip, s_w, s_opt, s_scaler = run("ssgd", bad, steps, scaler=scaler())
    o_skip, o_w, o_opt, o_scaler = run("odsgd", bad, steps, scaler=scaler())
    for sc in (s_scaler, o_scaler):
        assert (sc.scale, sc.good_steps, sc.n_skipped) == want
    assert want[:2] == (2.0**9, 2)                 # it backed off, then counted two good steps
    assert s_skip == flags                         # SSGD: at the step itself
    assert o_skip == [False] + flags[:-1]          # OD-SGD: when its mean arrives, one step later
    assert s_opt == o_opt == steps - 1             # one update skipped by each (finish applies OD-SGD's last)
    for a, b in zip(s_w[bad - 1], s_w[bad]):       # SSGD: W unchanged by the skipped step
        assert torch.equal(a, b)
    for a, b in zip(o_w[bad], o_w[bad + 1]):       # OD-SGD: W unchanged when round `bad` completes
        assert torch.equal(a, b)


@pytest.mark.parametrize("algorithm", ["ssgd", "odsgd"])
def test_without_a_scaler_both_stop_naming_the_step(algorithm):
    with pytest.raises(NonFiniteError, match="^step 1: non-finite loss on rank 0"):
        run(algorithm, 1, 4)
