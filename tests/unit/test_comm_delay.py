"""The emulated slow link (comm.delay_ms): a bucket completes no earlier than its start plus
the delay; a wait that starts later waits less; results are the inner sync's. A fake clock makes
the timing exact (no timed test)."""
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.comm.delay import DelayedSync, with_comm_delay
from hpctrain.topology import Topology


class FakeClock:
    def __init__(self, t=100.0):
        self.t, self.slept = t, []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.slept.append(round(s, 9))
        self.t += s


@pytest.fixture
def setup():
    topo = Topology.create(MPI.COMM_SELF)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    clock = FakeClock()
    # 64-byte buckets: one per parameter, so several buckets start at different times
    inner = comm_lib.create("flat", model.parameters(), topo, bucket_bytes=64, overlap=True)
    sync = DelayedSync(inner, 50.0, clock=clock, sleep=clock.sleep)
    yield model, sync, clock
    sync.close()
    topo.close()


def backward(model):
    model.zero_grad()
    model(torch.ones(2, 3)).square().sum().backward()


def test_wait_is_what_is_left_of_the_delay_after_the_last_start(setup):
    model, sync, clock = setup
    backward(model)                     # overlap hooks start every bucket at t=100
    assert len(sync.started) == len(sync.buckets) > 1
    assert sync.deadline_s() == pytest.approx(100.05)
    clock.t += 0.03                     # 30 ms of computation
    assert sync.poll() is False         # reduced already, but the link is slow
    sync.finish()
    assert clock.slept == [pytest.approx(0.02)]


def test_a_later_wait_waits_less_and_a_late_one_not_at_all(setup):
    model, sync, clock = setup
    for compute_s, want in ((0.0, [0.05]), (0.045, [0.005]), (0.2, [])):
        clock.slept = []
        backward(model)
        clock.t += compute_s
        sync.finish()
        assert clock.slept == [pytest.approx(w) for w in want]
        assert sync.deadline_s() is None


def test_explicit_begin_is_timed_and_results_are_the_inner_ones(setup):
    model, sync, clock = setup
    with torch.no_grad():
        grads = [torch.randn_like(p) for p in model.parameters()]
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    clock.t = 7.0
    sync.begin()
    assert sync.deadline_s() == pytest.approx(7.05)
    assert sync.finish() is False
    for p, g in zip(model.parameters(), grads):
        assert torch.equal(p.grad, g)           # one rank: the mean is the gradient itself
    assert sync.allreduce_grads() is False and clock.slept[-1] == pytest.approx(0.05)


def test_zero_delay_is_no_wrapper_and_negative_is_refused():
    topo = Topology.create(MPI.COMM_SELF)
    inner = comm_lib.create("flat", [torch.nn.Parameter(torch.zeros(2))], topo)
    assert with_comm_delay(inner, 0.0) is inner
    with pytest.raises(ValueError, match="comm_delay_ms"):
        with_comm_delay(inner, -1.0)
    inner.close()
    topo.close()


def test_poll_reduction_ignores_the_emulated_delay(setup):
    model, sync, clock = setup
    backward(model)
    assert sync.poll_reduction() is True and sync.poll() is False    # reduced; the link holds it back
    clock.t += 0.05
    assert sync.poll() is True
    sync.finish()
