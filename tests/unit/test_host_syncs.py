"""Host syncs per training step at one rank, counted on CPU stand-ins (``tests/host_syncs.py``).

At one rank nothing crosses to another rank: the gradient "reduction" is queued on the compute
stream behind backward (no event to wait for), the bucket's one buffer is both input and mean
(no device-to-device copy), the overflow flag is read only where a loss scaler needs it, and
the weight check's flag is read once its copy to the host has landed. Goal: no host sync in a
step in fp32 or bf16.
"""
import pytest
import torch
from mpi4py import MPI

from hpctrain.comm import streams
from hpctrain.topology import Topology
from tests.host_syncs import fake_device, reference, syncs_per_step
from tests.unit.fake_cuda import FakeCuda


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_one_rank_step_makes_no_host_sync(compute, monkeypatch, closer):
    topo = closer(Topology.create(MPI.COMM_SELF))
    count, net, _ = syncs_per_step(monkeypatch, topo, compute, cuda_aware=True, closer=closer)
    assert count == 0
    want = reference(compute)
    for p, q in zip(net.parameters(), want.parameters()):
        torch.testing.assert_close(p, q)


def test_one_rank_with_a_loss_scaler_reads_the_flag_once(monkeypatch, closer):
    topo = closer(Topology.create(MPI.COMM_SELF))
    count, _, _ = syncs_per_step(monkeypatch, topo, "fp32", scaler=True, cuda_aware=True, closer=closer)
    assert count == 1       # the scaler's verdict: skip or step, before the update


def test_one_rank_bucket_is_its_own_mean_no_copy(monkeypatch, closer):
    """The ring at one rank copied the whole bucket into the other buffer every step."""
    fake_device(monkeypatch, cuda_aware=True)
    from hpctrain import comm as comm_lib
    topo = closer(Topology.create(MPI.COMM_SELF))
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (3000, 5, 700)]
    sync = closer(comm_lib.create("flat", params, topo, bucket_bytes=4096))
    assert all(b.staging is None and b.single for b in sync.buckets)
    copies = []
    real = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, *a, **k: copies.append(self.numel()) or
                        real(self, src, *a, **k))
    for c in (2.0, 3.0, 4.0):
        copies.clear()          # the first round copies each fresh p.grad in, once
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        sum(((p * c) ** 2).sum() / 2 for p in params).backward()
        assert sync.finish(scatter=True) is False
        for p in params:        # d/dp (c p)^2 / 2 = c^2 p
            torch.testing.assert_close(p.grad, c * c * p.detach())
    assert copies == []


def test_nan_gradient_without_scaler_stops_at_the_weight_check(monkeypatch, closer):
    """The sync's flag is not read (fp32, no scaler, lazy check): a NaN gradient still stops
    the run, by the weight check, naming the step."""
    from hpctrain.update.guard import NonFiniteError
    from tests.host_syncs import batch, model
    from hpctrain.trainer import DistributedTrainer
    fake = fake_device(monkeypatch, cuda_aware=True)
    topo = closer(Topology.create(MPI.COMM_SELF))
    net = model()
    tr = closer(DistributedTrainer(net, torch.optim.SGD(net.parameters(), lr=0.1), topo, strategy="flat",
                                   tune="static", bucket_mb=0.001))
    tr.algo.guard.lazy = True
    fake.landed = True
    tr.step(*batch(0))
    tr.step(*batch(1))                  # step 0's flag read here: it had landed
    fake.landed = False
    x, y = batch(2)
    x[0, 0] = float("nan")
    tr.step(x, y)                       # not read: step 1's copy has not landed
    tr.step(*batch(3))                  # nor 2's: 1, 2 and 3 share one flag now
    fake.landed = True
    with pytest.raises(NonFiniteError, match="^steps 1-3: the weights became non-finite .*not checked: a non-finite "
                                             "loss or gradient"):
        tr.step(*batch(4))


def test_one_rank_device_bucket_needs_no_event(monkeypatch, closer):
    """A device bucket at one rank (``meta`` stands in for CUDA) is reduced on the compute
    stream behind backward: no event recorded for it and none to wait for in a blocking round.
    Before, each bucket recorded one and the blocking round waited for it on the host."""
    fake = FakeCuda()
    monkeypatch.setattr(streams, "API", fake)
    from hpctrain import comm as comm_lib
    topo = closer(Topology.create(MPI.COMM_SELF))
    params = [torch.nn.Parameter(torch.zeros(n, device="meta")) for n in (3000, 5)]
    sync = closer(comm_lib.create("flat", params, topo, bucket_bytes=4096))
    assert all(b.staging is None and b.single and b.flat.device.type == "meta" for b in sync.buckets)
    assert [sync._queue_input(b) for b in sync.buckets] == [None, None]
    assert fake.log == []
