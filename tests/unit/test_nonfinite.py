"""Non-finite numbers on one rank (COMM_SELF): the fused finiteness check against NumPy, and SSGD /
OD-SGD stopping with NonFiniteError naming the step and the rank, the weights untouched by the bad
step. Multi-rank agreement and the fp16 wire are in tests/mpi/test_nonfinite.py."""
import copy

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.errors import UserError
from hpctrain.optim.loss_scale import LossScaler, all_finite, finite_flag, grads_have_inf
from hpctrain.update import SSGD, NonFiniteError
from hpctrain.update.ssgd import MAX_WIRE_SKIPS, NonFiniteGuard
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer


@pytest.mark.parametrize("fused", [False, True])     # True: the GPU's multi-tensor path, on CPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_all_finite_matches_numpy(dtype, fused):
    g = torch.Generator().manual_seed(3)
    for trial in range(40):
        tensors = [torch.randn(n, generator=g).to(dtype) for n in (1, 7, 300, 70_000)]
        if trial % 4:                                   # one bad value somewhere, 3 trials in 4
            t = tensors[trial % len(tensors)]
            t.view(-1)[trial * 7919 % t.numel()] = (float("nan"), float("inf"), float("-inf"))[trial % 3]
        want = all(np.isfinite(t.float().numpy()).all() for t in tensors)
        assert all_finite(tensors, fused) is want
        assert all_finite(tensors + [None, torch.empty(0, dtype=dtype)], fused) is want
    assert all_finite([], fused) is True


@pytest.mark.parametrize("fused", [False, True])
def test_all_finite_large_finite_values_and_parameters(fused):
    assert all_finite([torch.full((1000,), 1e34), torch.full((1,), -3e38)], fused) is True
    half = torch.full((1000,), 60000.0, dtype=torch.float16)      # sums accumulate in fp32: no overflow
    assert all_finite([half], fused) is True and all_finite([half * 2], fused) is False
    p = torch.nn.Parameter(torch.ones(3))
    assert all_finite([p]) is True and all_finite([p.detach() * float("nan")]) is False
    p.grad = torch.tensor([1.0, float("nan"), 0.0])
    assert grads_have_inf([p]) is True


# --- the guard's decision, with an explicit set of per-rank verdicts ---------------------------------
class Verdicts:
    """A stand-in communicator: allgather returns the verdicts of a pretend 3-rank job."""

    def __init__(self, verdicts):
        self.verdicts, self.sent = verdicts, []

    def allgather(self, mine):
        self.sent.append(mine)
        return self.verdicts


def test_guard_names_each_bad_rank_and_what_went_wrong():
    comm = Verdicts([(True, True), (False, False), (True, False)])
    with pytest.raises(NonFiniteError, match=r"^step 7: non-finite loss on rank 1; non-finite gradient "
                                             r"\(finite loss\) on rank 2; stopped on every rank"):
        NonFiniteGuard(comm).overflow(7, torch.tensor(float("nan")), own_grads_finite=False)
    assert comm.sent == [(False, False)]
    with pytest.raises(NonFiniteError, match="^step 0: non-finite loss on ranks 0, 2;"):
        NonFiniteGuard(Verdicts([(False, False), (True, True), (False, True)])).overflow(0, torch.tensor(1.0), True)
    assert issubclass(NonFiniteError, UserError)


def test_guard_skips_finite_overflows_until_the_limit():
    guard = NonFiniteGuard(Verdicts([(True, True)] * 3))
    for step in range(MAX_WIRE_SKIPS - 1):
        guard.overflow(step, torch.tensor(1.0), True)             # skipped, no error
    guard.applied(99, [torch.ones(2)])                            # a clean update resets the count
    for step in range(MAX_WIRE_SKIPS - 1):
        guard.overflow(step, torch.tensor(1.0), True)
    with pytest.raises(NonFiniteError, match=f"{MAX_WIRE_SKIPS} steps in a row"):
        guard.overflow(50, torch.tensor(1.0), True)


def test_fused_flag_is_one_multi_tensor_reduction_and_no_host_read(monkeypatch):
    """The GPU path: one ``_foreach_norm`` for all tensors, never a per-tensor reduction, and
    nothing read back: the flag stays a 0-d tensor until someone asks."""
    calls = []
    real = torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm", lambda ts, *a, **k: calls.append(len(ts)) or real(ts, *a, **k))
    tensors = [torch.ones(n) for n in range(1, 161)]               # ResNet-50 has ~160
    sums, real_sum = [], torch.Tensor.sum
    monkeypatch.setattr(torch.Tensor, "sum", lambda *a, **k: sums.append(1) or real_sum(*a, **k))
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda self: pytest.fail("read back"))
    flag = finite_flag(tensors, fused=True)
    assert calls == [160] and len(sums) == 1          # the one sum of the 160 norms
    assert isinstance(flag, torch.Tensor) and flag.dim() == 0


def test_lazy_guard_reads_the_weight_flag_once_later_and_names_the_step():
    guard = NonFiniteGuard(Verdicts([]), lazy=True)
    bad = [torch.ones(3), torch.tensor([float("inf")])]
    guard.applied(7, bad)                       # no read, no raise: the flag is pending
    assert guard.pending[0] == 7
    with pytest.raises(NonFiniteError, match="^step 7: the weights became non-finite"):
        guard.settle()
    assert guard.pending is None
    guard.settle()                              # read once
    guard.applied(8, [torch.ones(2)])
    with pytest.raises(NonFiniteError, match="^step 9:"):
        guard.applied(9, bad) or guard.applied(10, [torch.ones(2)])   # 9's flag read at 10
    with pytest.raises(NonFiniteError, match="^step 3:"):            # CPU default: at once
        NonFiniteGuard(Verdicts([])).applied(3, bad)


# --- SSGD and OD-SGD on one rank ----------------------------------------------------------------------
def make(algorithm="ssgd", lr=0.1, scaler=None, **opts):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    topo = Topology.create(MPI.COMM_SELF)
    tr = DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=lr), topo, algorithm=algorithm,
                            algorithm_options=opts, scaler=scaler)
    return tr, model, topo


def batch(t, bad=False):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(t))
    return (x * float("nan") if bad else x), torch.tensor([0, 1, 0])


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def test_ssgd_nan_loss_stops_naming_step_and_rank_weights_untouched():
    tr, model, topo = make()
    for t in range(3):
        tr.step(*batch(t))
    before = weights(model)
    with pytest.raises(NonFiniteError, match=r"^step 3: non-finite loss on rank 0; stopped on every rank"):
        tr.step(*batch(3, bad=True))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    tr.close()
    topo.close()


def test_ssgd_non_finite_gradient_with_finite_loss_is_named_as_such():
    tr, model, topo = make()
    hook = model.weight.register_hook(lambda g: g * float("inf"))       # finite loss, inf/NaN gradient
    with pytest.raises(NonFiniteError, match=r"^step 0: non-finite gradient \(finite loss\) on rank 0"):
        tr.step(*batch(0))
    hook.remove()
    tr.close()
    topo.close()


def test_ssgd_weights_overflowing_in_the_update_stop_the_run():
    """A finite gradient times a huge lr: the weights the update writes are inf (NumPy agrees)."""
    lr = 1e37
    tr, model, topo = make(lr=lr)
    x, y = batch(0)
    x = x * 1000.0
    ref = copy.deepcopy(model)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    assert all(np.isfinite(p.grad.numpy()).all() for p in ref.parameters())       # the gradient is finite
    with np.errstate(over="ignore", invalid="ignore"):
        new = [p.detach().numpy() - np.float32(lr) * p.grad.numpy() for p in ref.parameters()]
    assert not all(np.isfinite(w).all() for w in new)                               # the update is not
    with pytest.raises(NonFiniteError, match="^step 0: the weights became non-finite in the update"):
        tr.step(x, y)
    tr.close()
    topo.close()


def test_ssgd_with_loss_scaler_skips_instead_of_stopping():
    tr, model, topo = make(scaler=LossScaler(init_scale=256.0, growth_interval=1000))
    tr.step(*batch(0))
    before = weights(model)
    r = tr.step(*batch(1, bad=True))
    assert r.skipped and tr.algo.scaler.scale == 128.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not tr.step(*batch(2)).skipped
    tr.close()
    topo.close()


def test_odsgd_nan_is_stopped_when_its_delayed_mean_arrives():
    """OD-SGD: a NaN at step 4 (after 2 warm-up steps) stops at step 5, naming step 4; W is the
    global weights of the update before, finite."""
    tr, model, topo = make("odsgd", warmup_steps=2)
    for t in range(4):
        tr.step(*batch(t))
    W = [w.clone() for w in tr.algo.global_weights()]
    tr.step(*batch(4, bad=True))                  # the local step runs on NaN; nothing known yet
    assert not all(torch.isfinite(p).all() for p in model.parameters())     # ŵ_5 on this rank
    with pytest.raises(NonFiniteError, match=r"^step 4: non-finite loss on rank 0"):
        tr.step(*batch(5))
    assert not tr.algo.in_flight
    assert all(torch.isfinite(p).all() for p in model.parameters())        # W_5, from step 3's mean
    assert not any(torch.equal(a, b) for a, b in zip(W, model.parameters()))
    tr.close()
    topo.close()


def test_odsgd_nan_at_the_last_step_is_stopped_by_finish():
    tr, model, topo = make("odsgd", warmup_steps=1)
    for t in range(3):
        tr.step(*batch(t))
    tr.step(*batch(3, bad=True))
    with pytest.raises(NonFiniteError, match="^step 3: non-finite loss on rank 0"):
        tr.finish()
    tr.close()
    topo.close()


def test_odsgd_nan_during_warmup_is_ssgds_error():
    tr, model, topo = make("odsgd", warmup_steps=5)
    tr.step(*batch(0))
    with pytest.raises(NonFiniteError, match="^step 1: non-finite loss on rank 0"):
        tr.step(*batch(1, bad=True))
    tr.close()
    topo.close()


def test_ssgd_step_count_survives_a_checkpoint():
    tr, model, topo = make()
    for t in range(2):
        tr.step(*batch(t))
    state = tr.algo.state_dict()
    assert state["steps"] == 2
    other = SSGD(model, tr.optimizer, tr.grad_sync)
    other.load_state_dict(state)
    with pytest.raises(NonFiniteError, match="^step 2:"):
        other.step(lambda: torch.tensor(float("nan"), requires_grad=True) * model.weight.sum())
    tr.close()
    topo.close()


def test_guard_uses_the_syncs_communicator_through_wrappers():
    topo = Topology.create(MPI.COMM_SELF)
    model = torch.nn.Linear(2, 1)
    inner = comm_lib.create("flat", model.parameters(), topo)
    from hpctrain.comm import with_comm_delay
    algo = SSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), with_comm_delay(inner, 1.0))
    assert algo.guard.comm is inner.comm
    inner.close()
    topo.close()
