"""The order of the staged path's CUDA calls, on CPU stand-ins (issue 22).

No GPU where this is developed: :mod:`hpctrain.comm.streams` is replaced by the recording fake of
``tests/unit/fake_cuda.py`` (CPU tensors take the CUDA code paths; copies and kernels run on the
CPU at once; every stream/event call is logged) and the CUDA runtime's host registration by a
recording fake, so each test asserts an order a GPU would depend on:

* ``close()`` blocks on every bucket's copy events (device-to-host and host-to-device) before
  any host memory is unregistered, and the window is freed last (finding 9).
* a blocking round queues every bucket's device-to-host copy before it reduces the first, and
  waits (on the host) for each bucket's own copy event just before that bucket (finding 3).
* the direct route's ring runs its kernels on its own stream and, before MPI reads what a
  kernel wrote, waits for that kernel's event only: never for the whole compute stream
  (finding 4).
* device buckets keep their overflow flags on the device: nothing reads one on the host while
  backward runs (the overlap hooks, autograd's thread), and a round reads them once, however
  many buckets it has (issue 34, N6).
"""
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.ops import testhooks
from hpctrain.comm import cuda_mpi, ring, staging, streams
from hpctrain.comm.window import SharedWindow
from hpctrain.topology import Topology
from tests.unit.fake_cuda import FakeCuda

pytestmark = pytest.mark.mpi


class LoggingCudart:
    def __init__(self, log):
        self.log = log

    def cudaHostRegister(self, ptr, n_bytes, flags):
        self.log.append(("register", ptr))
        return 0

    def cudaHostUnregister(self, ptr):
        self.log.append(("unregister", ptr))
        return 0


def fake_device(monkeypatch):
    """Staged buckets whose streams, events and host registration are recorded in one log."""
    fake = FakeCuda()
    monkeypatch.setattr(streams, "API", fake)
    monkeypatch.setattr(cuda_mpi, "cudart", lambda: LoggingCudart(fake.log))
    monkeypatch.setenv(testhooks.TEST_STAGING, "1")
    monkeypatch.setenv(cuda_mpi.AWARE_SWITCH, "0")
    return fake


def backward(params, comm):
    loss = sum((p * (comm.Get_rank() + 1.0)).sum() for p in params)
    loss.backward()


@pytest.mark.parametrize("strategy", ["flat", "hierarchical"])
def test_close_waits_for_every_copy_before_memory_is_unregistered_or_freed(strategy, monkeypatch, closer):
    fake = fake_device(monkeypatch)
    real_free = SharedWindow.free
    monkeypatch.setattr(SharedWindow, "free", lambda self: fake.log.append(("free window",)) or real_free(self))
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=2))
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3000, 5, 70000)]
    sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=16 * 1024))
    assert len(sync.buckets) > 1
    backward(params, topo.comm)
    sync.allreduce_grads()              # each bucket: a D2H copy event, and the H2D copy's
    n = topo.comm.Get_size()
    want = sum(r + 1.0 for r in range(n)) / n
    assert all(torch.allclose(p.grad, torch.full_like(p, want)) for p in params)
    fake.log.clear()
    sync.close()
    log = fake.log
    events = {e for b in sync.buckets for e in (b.staging.ready.event.name, b.staging.back.event.name)}
    synced = [i for i, e in enumerate(log) if e[0] == "event sync" and e[1] in events]
    unregistered = [i for i, e in enumerate(log) if e[0] == "unregister"]
    assert {log[i][1] for i in synced} == events, "a copy event was not waited for"
    assert unregistered and max(synced) < min(unregistered), log
    if strategy == "hierarchical":
        assert log[-1] == ("free window",) and max(unregistered) < len(log) - 1


def log_reductions(sync, log):
    """Append ("reduce", i) to ``log`` when bucket i's reduction starts running."""
    real = sync.reduce_bucket

    def reduce_bucket(bucket):
        log.append(("reduce", bucket.index))
        return (yield from real(bucket))
    sync.reduce_bucket = reduce_bucket


@pytest.mark.parametrize("strategy", ["flat", "hierarchical"])
def test_blocking_round_queues_every_copy_before_the_first_reduction(strategy, monkeypatch, closer):
    fake = fake_device(monkeypatch)
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=2))
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3000, 5, 70000, 20)]
    sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=16 * 1024))
    log_reductions(sync, fake.log)
    copy_event = {b.staging.ready.event.name: b.index for b in sync.buckets}
    assert len(copy_event) > 2
    for _ in range(2):
        fake.log.clear()
        backward(params, topo.comm)
        sync.allreduce_grads()          # nothing started before: a blocking round
        log = fake.log
        queued = [i for i, e in enumerate(log) if e[0] == "record" and e[1] in copy_event]
        reduced = [i for i, e in enumerate(log) if e[0] == "reduce"]
        assert len(queued) == len(reduced) == len(sync.buckets)
        assert max(queued) < min(reduced), log
        for i in reduced:               # just before each reduction: its own copy event, once
            waited = [e for e in log[:i] if e[0] == "event sync" and e[1] in copy_event]
            assert [copy_event[e[1]] for e in waited] == list(range(log[i][1] + 1))
        assert [log[i][1] for i in reduced] == list(range(len(sync.buckets)))


@pytest.mark.parametrize("overlap", [False, True])
def test_direct_ring_waits_on_its_own_events_not_the_compute_stream(overlap, monkeypatch, closer):
    fake = fake_device(monkeypatch)
    monkeypatch.setenv(cuda_mpi.AWARE_SWITCH, "1")       # direct: device buffers go to MPI
    monkeypatch.setattr(ring, "AS_TENSOR", frozenset({"cpu", "cuda"}))
    msg = ring._msg
    monkeypatch.setattr(ring, "_msg", lambda t: fake.log.append(("post",)) or msg(t))
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=1))
    comm = topo.comm
    params = [torch.nn.Parameter(torch.zeros(1_200_000))]     # one ring bucket (> MPI_MAX_BYTES)
    sync = closer(comm_lib.create("flat", params, topo, bucket_bytes=8 << 20, overlap=overlap))
    assert all(b.staging is None for b in sync.buckets) and sync._methods() == ["ring"]
    (rb,) = sync._rings
    fake.log.clear()
    backward(params, comm)
    sync.allreduce_grads()
    n = comm.Get_size()
    assert torch.allclose(params[0].grad, torch.full_like(params[0], sum(range(1, n + 1)) / n))
    log = fake.log
    assert ("stream sync", "compute") not in log, "waited for the whole compute stream"
    if n == 1:
        return
    kernels = [i for i, e in enumerate(log) if e == ("enter", rb.stream.name)]
    records = [i for i, e in enumerate(log) if e[0] == "record" and e[2] == rb.stream.name]
    assert len(kernels) == len(records) == n - 1        # one reduce per step, on the ring's stream
    event = rb.step_done.event.name
    for i in records:               # the next message MPI posts comes after that event completed
        nxt = next(j for j in range(i, len(log)) if log[j] == ("post",))
        assert any(e in (("query", event), ("event sync", event)) for e in log[i:nxt]), log[i:nxt]


@pytest.mark.parametrize("overlap", [False, True])
def test_direct_buckets_read_their_overflow_flags_once_per_round(overlap, monkeypatch, closer):
    """MPI's and the ring's buckets, direct (device buffers), any world size: one host read per
    round, in finish(), none during backward. Before issue 34 each bucket's scale_and_check
    read its flag on the host (bool) as its reduction ended: in the overlap hooks."""
    fake = fake_device(monkeypatch)
    monkeypatch.setenv(cuda_mpi.AWARE_SWITCH, "1")
    monkeypatch.setattr(ring, "AS_TENSOR", frozenset({"cpu", "cuda"}))
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=1))
    comm = topo.comm
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (1_200_000, 300, 5000, 1_100_000, 7)]
    sync = closer(comm_lib.create("flat", params, topo, bucket_bytes=4 << 20, overlap=overlap))
    assert len(sync.buckets) >= 3 and all(b.staging is None for b in sync.buckets)
    if comm.Get_size() > 1:     # overlapped, device buffers avoid MPI's Iallreduce: all ring
        assert {"mpi", "ring"} <= set(sync._methods()) if not overlap else "ring" in sync._methods()
    n = comm.Get_size()
    for poison in (False, True, False):
        fake.log.clear()
        loss = sum((p * (comm.Get_rank() + 1.0)).sum() for p in params)
        if poison:
            loss = loss + params[2][0] * float("inf")
        loss.backward()
        during_backward = fake.host_reads
        found = sync.finish(scatter=True)
        assert during_backward == 0 and fake.host_reads == 1, fake.log
        assert found is poison
        if not poison:
            assert torch.allclose(params[0].grad, torch.full_like(params[0], sum(range(1, n + 1)) / n))
        for p in params:
            p.grad.zero_()
