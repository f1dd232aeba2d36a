"""Host syncs per training step, counted on CPU stand-ins (shared by the one-rank and MPI tests).

``streams.API`` is the recording fake of ``tests/unit/fake_cuda.py`` with every event reported
not landed when queried (the worst case: each wait that could block does), buckets take the
device paths (``HPCTRAIN_TEST_STAGING``), and the weight check is lazy as on a GPU. A host sync
is whatever the fake logs as one (a flag read through ``streams.host_read``, an event or stream
synchronisation) plus every ``bool()`` / ``item()`` of a tensor during the step: on a GPU each
of those waits for the stream.
"""
import contextlib

import torch

from hpctrain.comm import cuda_mpi, ring, streams
from hpctrain.ops import testhooks
from hpctrain.optim.loss_scale import LossScaler
from hpctrain.trainer import DistributedTrainer
from tests.unit.fake_cuda import FakeCuda

N_IN, N_HIDDEN, N_OUT, BATCH = 6, 32, 4, 8


def fake_device(monkeypatch, cuda_aware: bool = False) -> FakeCuda:
    fake = FakeCuda()
    fake.landed = False
    monkeypatch.setattr(streams, "API", fake)
    monkeypatch.setenv(testhooks.TEST_STAGING, "1")
    monkeypatch.setenv(cuda_mpi.AWARE_SWITCH, "1" if cuda_aware else "0")
    if cuda_aware:      # direct buckets hand MPI their "device" tensors and keep flags there
        monkeypatch.setattr(ring, "AS_TENSOR", frozenset({"cpu", "cuda"}))
    return fake


def model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(N_IN, N_HIDDEN), torch.nn.ReLU(), torch.nn.Linear(N_HIDDEN, N_OUT))


def batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, N_IN, generator=g), torch.randint(0, N_OUT, (BATCH,), generator=g)


@contextlib.contextmanager
def counting_reads(monkeypatch):
    """Count ``bool()``/``item()`` of tensors (each a host sync on a GPU) while active."""
    counts = [0]
    real_bool, real_item = torch.Tensor.__bool__, torch.Tensor.item

    def counted(real):
        def f(self, *a):
            counts[0] += 1
            return real(self, *a)
        return f
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "__bool__", counted(real_bool))
        m.setattr(torch.Tensor, "item", counted(real_item))
        yield counts


def syncs_per_step(monkeypatch, topo, compute: str, *, scaler: bool = False, cuda_aware: bool = False,
                   steps: int = 4, closer=None):
    """Train ``steps`` steps of the same batches on every rank; returns (host syncs of the last
    step, the trained model, the trainer still open)."""
    fake = fake_device(monkeypatch, cuda_aware)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    tr = DistributedTrainer(net, opt, topo, strategy="flat", tune="static", bucket_mb=0.001, compute=compute,
                            scaler=LossScaler() if scaler else None)
    if closer is not None:
        closer(tr)
    assert len(tr.grad_sync.buckets) > 1
    tr.algo.guard.lazy = True           # as on a GPU: the weight flag is read later
    count = 0
    for step in range(steps):
        fake.log.clear()
        with counting_reads(monkeypatch) as reads:
            tr.step(*batch(step))
        # the fake's host_read is a bool() too: counted once, among the reads
        count = fake.host_waits - fake.host_reads + reads[0]
    tr.finish()
    return count, net, tr


def reference(compute: str, steps: int = 4) -> torch.nn.Module:
    """The same steps by torch alone, in one process (every rank had the same batch)."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    dtype = {"fp32": None, "bf16": torch.bfloat16}[compute]
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext():
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
    return net
