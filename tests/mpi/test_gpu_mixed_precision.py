"""fp16 autocast with dynamic loss scaling, and bf16, on CUDA (``-m gpu``; skipped here: "needs a
CUDA device"). Written for GPU nodes; not run on the CPU-only machines it was written on.

An inf loss on ONE rank (forced) must make the gradient sync's found_inf true on EVERY rank: the
step is skipped everywhere, the scale halves, the weights stay as they were; the next clean step
is applied and the replicas stay identical. Autocast runs on the model's device (fp16
activations on cuda), never on a fixed "cpu".
"""
import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.api import bind_device
from hpctrain.optim.loss_scale import LossScaler
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

pytestmark = [pytest.mark.mpi, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def setup(topo, device, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, DistributedTrainer(model, opt, topo, **kw)


def batch(device, rank):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(8, 16, generator=g).to(device), torch.randint(0, 4, (8,), generator=g).to(device)


def same_everywhere(comm, params) -> bool:
    return len(set(comm.allgather(comm_lib.checksum([p.cpu() for p in params])))) == 1


@pytest.mark.parametrize("compression", sorted(comm_lib.COMPRESSIONS))
@pytest.mark.parametrize("strategy", comm_lib.concrete())
def test_fp16_autocast_forced_overflow_skips_everywhere_and_halves_the_scale(strategy, compression, closer):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    topo = closer(Topology.create(comm))
    device = bind_device(topo, "cuda")
    scaler = LossScaler(init_scale=1024.0, growth_interval=1000)
    model, trainer = setup(topo, device, strategy=strategy, compression=compression, compute="fp16",
                           scaler=scaler)
    closer(trainer)
    x, y = batch(device, rank)
    with trainer.autocast():
        out = model(x)
    assert out.dtype == torch.float16 and out.device == device        # autocast on the model's device
    bad = size - 1
    trainer.loss_fn = lambda out, y: F.cross_entropy(out, y) * (float("inf") if rank == bad else 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.step(x, y)
    assert all(comm.allgather(bool(result.skipped)))                 # the sync's found_inf, on every rank
    assert scaler.scale == 512.0 and scaler.n_skipped == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    trainer.loss_fn = F.cross_entropy
    result = trainer.step(x, y)
    assert not any(comm.allgather(bool(result.skipped))) and scaler.scale == 512.0
    assert result.loss.device == device and torch.isfinite(result.loss)
    assert all(p.device == device and p.dtype == torch.float32 for p in model.parameters())   # fp32 masters
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert same_everywhere(comm, model.parameters())


def test_bf16_autocast_on_cuda(closer):
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm))
    device = bind_device(topo, "cuda")
    if not torch.cuda.is_bf16_supported():
        with pytest.raises(ValueError, match="bf16 compute is not supported"):
            setup(topo, device, compute="bf16")
        return
    model, trainer = setup(topo, device, compute="bf16")
    closer(trainer)
    x, y = batch(device, comm.Get_rank())
    with trainer.autocast():
        assert model(x).dtype == torch.bfloat16
    for _ in range(3):
        result = trainer.step(x, y)
        assert not result.skipped and torch.isfinite(result.loss)
    assert same_everywhere(comm, model.parameters())
