"""Mixed precision: an inf gradient on ONE rank skips the step on EVERY rank and halves the scale."""
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.optim.loss_scale import LossScaler
from hpctrain.update import SSGD
from hpctrain.topology import Topology


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", sorted(comm_lib.STRATEGIES))
def test_overflow_on_one_rank_skips_everywhere(strategy):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    comm_lib.broadcast_module(model, comm)
    topo = Topology.create(comm)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = LossScaler(init_scale=1024.0, growth_interval=1000)
    algo = SSGD(model, opt, comm_lib.create(strategy, model.parameters(), topo), scaler=scaler)
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    bad_rank = size - 1

    def loss_fn():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        return loss * float("inf") if rank == bad_rank else loss

    before = [p.detach().clone() for p in model.parameters()]
    result = algo.step(loss_fn)
    assert result.skipped
    assert scaler.scale == 512.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # a clean step afterwards is applied, everywhere, and weights stay finite and identical
    result = algo.step(lambda: torch.nn.functional.cross_entropy(model(x), y))
    assert not result.skipped and scaler.scale == 512.0
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert len(set(comm.allgather(comm_lib.checksum(model.parameters())))) == 1
    algo.grad_sync.close()
    topo.close()


@pytest.mark.mpi
def test_scaled_step_equals_unscaled_step():
    """Loss scaling must not change the update when nothing overflows."""
    comm = MPI.COMM_WORLD
    topo = Topology.create(comm)
    results = []
    for scaler in (None, LossScaler(init_scale=2.0**10)):
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 3).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = SSGD(model, opt, comm_lib.create("flat", model.parameters(), topo), scaler=scaler)
        x = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(comm.Get_rank()))
        algo.step(lambda: torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 0, 1])))
        results.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        algo.grad_sync.close()
    assert torch.allclose(results[0], results[1], rtol=0, atol=1e-14)
    topo.close()


@pytest.mark.mpi
def test_fp16_wire_overflow_with_a_scaler_backs_off_then_applies(closer):
    """Gradient 100 scaled by 1024 overflows fp16 on the wire (NumPy says so); the scaler skips the
    step on every rank and halves; at 512 the scaled mean fits and the update is w - lr*100."""
    import numpy as np
    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        pytest.skip("nothing crosses a wire on one rank")
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(100 * 1024.0)) and np.isfinite(np.float16(100 * 512.0))
    topo = closer(Topology.create(comm))
    model = torch.nn.Linear(70_000, 1, bias=False)          # > 64 KiB: the fp16 ring
    comm_lib.broadcast_module(model, comm)
    sync = closer(comm_lib.create("flat", model.parameters(), topo, compression="fp16"))
    scaler = LossScaler(init_scale=1024.0, growth_interval=1000)
    algo = SSGD(model, torch.optim.SGD(model.parameters(), lr=1e-3), sync, scaler=scaler)
    w0 = model.weight.detach().clone()
    r = algo.step(lambda: (model.weight * 100.0).sum())
    assert all(comm.allgather(r.skipped)) and scaler.scale == 512.0 and torch.equal(model.weight, w0)
    r = algo.step(lambda: (model.weight * 100.0).sum())
    assert not any(comm.allgather(r.skipped)) and algo.guard.wire_skips == 0
    size = comm.Get_size()
    torch.testing.assert_close(model.weight.detach(), w0 - 1e-3 * 100.0, rtol=0,
                               atol=1e-3 * 100.0 * (size + 1) * 2**-11 + 1e-7)
