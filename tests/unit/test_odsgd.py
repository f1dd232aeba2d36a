"""OD-SGD on one rank against hand formulas (NumPy) and an independent torch simulation; its pure
parts; the checkpoint contract. The references here are shared with tests/mpi/test_odsgd.py."""
import io
import re

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import update as update_lib
from hpctrain.optim import LARS
from hpctrain.optim.schedules import ScheduleSpec, lr_at
from hpctrain.update.odsgd import dc_compensate_, group_lrs, swap_data_
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

DIM, PER_RANK = 4, 3


# --- the problem: y = x.w, loss 0.5*mean((x.w - y)^2), float64 -------------------------------------
def half_mse(out, y):
    return 0.5 * ((out.squeeze(1) - y) ** 2).mean()


def linear_model():
    torch.manual_seed(11)
    return torch.nn.Linear(DIM, 1, bias=False).double()


def linear_batches(n_ranks: int, steps: int, seed: int = 5):
    """Fixed global batches (x, y), the same on every rank; rank k takes rows k*PER_RANK…"""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n_ranks * PER_RANK, DIM, generator=g, dtype=torch.float64),
             torch.randn(n_ranks * PER_RANK, generator=g, dtype=torch.float64)) for _ in range(steps)]


def rank_slice(k: int) -> slice:
    return slice(k * PER_RANK, (k + 1) * PER_RANK)


def hand_odsgd(w0, batches, n_ranks, warmup, lrs, local_lr):
    """The issue's formulas with plain SGD, in NumPy; per step (W, [ŵ_k]) after the step.

    W is the global weights of the last completed global update (what every rank holds)."""
    def grad(w, x, y):                        # d/dw of 0.5*mean((xw - y)^2)
        return x.T @ (x @ w - y) / len(y)
    W, local, pending, out = w0.copy(), [w0.copy()] * n_ranks, None, []
    for t, (x, y) in enumerate(batches):
        x, y = x.numpy(), y.numpy()
        g = [grad(local[k], x[rank_slice(k)], y[rank_slice(k)]) for k in range(n_ranks)]
        if t < warmup:                         # SSGD: W_{t+1} = W_t - lr_t * mean g
            W = W - lrs[t] * sum(g) / n_ranks
            local = [W] * n_ranks
        else:
            if pending is not None:            # global update with step t-1's mean and lr
                W = W - pending[1] * pending[0]
            pending = (sum(g) / n_ranks, lrs[t])
            local = [W - (local_lr or lrs[t]) * g[k] for k in range(n_ranks)]   # ŵ_{t+1} = W_t - η_l g_t
        out.append((W.copy(), [w.copy() for w in local]))
    return out


def torch_odsgd(make_model, make_opt, batches, n_ranks, warmup, lrs, loss_fn, *,
                local_lr=0.0, local_momentum=0.0, dc_lambda=0.0):
    """An independent OD-SGD: one torch model per rank for ŵ_k, one for W with the real optimiser.
    Yields (W, [ŵ_k]) as lists of tensors after every step."""
    glob = make_model()
    opt = make_opt(glob)
    locs = [make_model() for _ in range(n_ranks)]
    bufs = [[torch.zeros_like(p) for p in glob.parameters()] for _ in range(n_ranks)]
    pending = None

    def apply_global(mean, lr):
        for grp in opt.param_groups:
            grp["lr"] = lr
        for p, m in zip(glob.parameters(), mean):
            p.grad = m.clone()
        opt.step()

    for t, (x, y) in enumerate(batches):
        grads = []
        for k, m in enumerate(locs):
            m.zero_grad()
            loss_fn(m(x[rank_slice(k)]), y[rank_slice(k)]).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        mean = lambda gs: [sum(g[i] for g in gs) / n_ranks for i in range(len(gs[0]))]  # noqa: E731
        with torch.no_grad():
            if t < warmup:
                apply_global(mean(grads), lrs[t])
                for m in locs:
                    m.load_state_dict(glob.state_dict())
            else:
                if pending is not None:
                    apply_global(*pending)
                    if dc_lambda:
                        grads = [[g + dc_lambda * g * g * (w - wl) for g, w, wl in
                                  zip(gk, glob.parameters(), m.parameters())] for gk, m in zip(grads, locs)]
                pending = (mean(grads), lrs[t])
                for k, m in enumerate(locs):
                    for p, w, g, u in zip(m.parameters(), glob.parameters(), grads[k], bufs[k]):
                        u.mul_(local_momentum).add_(g)
                        p.copy_(w - (local_lr or lrs[t]) * u)
        yield ([p.detach().clone() for p in glob.parameters()],
               [[p.detach().clone() for p in m.parameters()] for m in locs])


def make_trainer(comm, model, opt, *, spec=None, loss_fn=half_mse, strategy="flat", compression="none",
                 overlap=False, bucket_mb=25.0, ranks_per_node=0, comm_delay_ms=0.0, **opts):
    topo = Topology.create(comm, ranks_per_node)
    tr = DistributedTrainer(model, opt, topo, strategy=strategy, compression=compression, overlap=overlap,
                            bucket_mb=bucket_mb, algorithm="odsgd", algorithm_options=opts, schedule=spec,
                            loss_fn=loss_fn, comm_delay_ms=comm_delay_ms)
    return tr, topo


def schedule(steps):
    return ScheduleSpec(peak_lr=0.2, warmup_steps=3, total_steps=steps, kind="cosine")


def save_load(state: dict) -> dict:
    """Through bytes, as a checkpoint file does."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return torch.load(io.BytesIO(buf.getvalue()), weights_only=True)


# --- serial tests (one rank: the mean is the rank's own gradient) ----------------------------------
@pytest.mark.parametrize("warmup,local_lr", [(0, 0.0), (3, 0.0), (2, 0.05)])
def test_one_rank_matches_hand_formulas_step_by_step(warmup, local_lr):
    steps = 9
    model = linear_model()
    w0 = model.weight.detach().numpy()[0].copy()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    spec = schedule(steps)
    tr, topo = make_trainer(MPI.COMM_SELF, model, opt, spec=spec, warmup_steps=warmup, local_lr=local_lr)
    batches = linear_batches(1, steps)
    want = hand_odsgd(w0, batches, 1, warmup, [lr_at(t, spec) for t in range(steps)], local_lr)
    for t, (x, y) in enumerate(batches):
        tr.step(x, y)
        W, local = want[t]
        np.testing.assert_allclose(tr.algo.global_weights()[0].numpy()[0], W, rtol=0, atol=1e-13)
        np.testing.assert_allclose(model.weight.detach().numpy()[0], local[0], rtol=0, atol=1e-13)
        assert tr.algo.in_flight == (t >= warmup)
    tr.finish()                                # the pending global update, then ŵ := W
    x, y = batches[-1][0].numpy(), batches[-1][1].numpy()
    w_last = want[-2][1][0]                    # the last gradient was taken at the previous ŵ
    W_final = want[-1][0] - lr_at(steps - 1, spec) * (x.T @ (x @ w_last - y) / len(y))
    np.testing.assert_allclose(model.weight.detach().numpy()[0], W_final, rtol=0, atol=1e-13)
    tr.close()
    topo.close()


def test_warmup_covering_the_run_is_ssgd_bit_for_bit():
    steps, out = 6, []
    for algo, opts in (("ssgd", {}), ("odsgd", {"warmup_steps": steps})):
        model = linear_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        topo = Topology.create(MPI.COMM_SELF)
        tr = DistributedTrainer(model, opt, topo, algorithm=algo, algorithm_options=opts, loss_fn=half_mse,
                                schedule=schedule(steps))
        for x, y in linear_batches(1, steps):
            tr.step(x, y)
        tr.finish()
        out.append(model.weight.detach().clone())
        tr.close()
        topo.close()
    assert torch.equal(out[0], out[1])


def test_state_dict_refused_in_flight_and_resume_continues_bit_identically():
    steps, at = 10, 6
    opts = dict(warmup_steps=2, local_momentum=0.5, dc_lambda=0.3)

    def fresh():
        model = linear_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        topo = Topology.create(MPI.COMM_SELF)
        return DistributedTrainer(model, opt, topo, algorithm="odsgd", algorithm_options=dict(opts),
                                  loss_fn=half_mse, schedule=schedule(steps)), model, topo

    batches = linear_batches(1, steps)
    a, model_a, topo_a = fresh()
    saved = None
    for t, (x, y) in enumerate(batches):
        if t == at:
            with pytest.raises(RuntimeError, match="trainer.finish"):
                a.state_dict()
            a.finish()
            saved = save_load(a.state_dict())
        a.step(x, y)
    a.finish()
    b, model_b, topo_b = fresh()
    b.load_state_dict(saved)
    assert b.step_count == at and b.algo.steps == at
    for x, y in batches[at:]:
        b.step(x, y)
    b.finish()
    assert torch.equal(model_a.weight, model_b.weight)
    assert torch.equal(a.optimizer.state_dict()["state"][0]["momentum_buffer"],
                       b.optimizer.state_dict()["state"][0]["momentum_buffer"])
    for tr, topo in ((a, topo_a), (b, topo_b)):
        tr.close()
        topo.close()


def test_momentum_local_momentum_and_dc_match_independent_torch_simulation():
    steps = 8
    opts = dict(warmup_steps=2, local_lr=0.03, local_momentum=0.5, dc_lambda=0.7)
    make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-2)  # noqa: E731
    model = linear_model()
    tr, topo = make_trainer(MPI.COMM_SELF, model, make_opt(model), spec=schedule(steps), **opts)
    batches = linear_batches(1, steps)
    ref = torch_odsgd(linear_model, make_opt, batches, 1, 2, [lr_at(t, schedule(steps)) for t in range(steps)],
                      half_mse, local_lr=0.03, local_momentum=0.5, dc_lambda=0.7)
    for (x, y), (W, locs) in zip(batches, ref):
        tr.step(x, y)
        torch.testing.assert_close(tr.algo.global_weights()[0], W[0], rtol=0, atol=1e-13)
        torch.testing.assert_close(model.weight.detach(), locs[0][0], rtol=0, atol=1e-13)
    tr.close()
    topo.close()


# --- pure parts -------------------------------------------------------------------------------------
def test_dc_compensation_formula():
    g, wl, w = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([0.5, 0.5, 0.5]), torch.tensor([1.5, 0.0, 0.5])
    want = g.numpy() + 0.1 * g.numpy() ** 2 * (w.numpy() - wl.numpy())
    dc_compensate_([g], [wl], [w], 0.1)
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-7)


def test_swap_data_exchanges_storage_without_copies():
    p = torch.nn.Parameter(torch.zeros(3))
    other = torch.ones(3)
    ptr_p, ptr_o = p.data_ptr(), other.data_ptr()
    store = [other]
    swap_data_([p], store)
    assert p.data_ptr() == ptr_o and store[0].data_ptr() == ptr_p and float(p.detach().sum()) == 3.0


def test_group_lrs_sets_then_restores():
    opt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))]},
                           {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.5}], lr=0.1)
    with group_lrs(opt, [1.0, 2.0]):
        assert [g["lr"] for g in opt.param_groups] == [1.0, 2.0]
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]


def test_option_errors_name_the_field():
    model = linear_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for bad, key in ((dict(warmup_steps=-1), "update.odsgd.warmup_steps"),
                     (dict(local_momentum=1.0), "update.odsgd.local_momentum"),
                     (dict(local_lr=-1.0), "update.odsgd.local_lr"), (dict(dc_lambda=-0.1), "update.odsgd.dc_lambda")):
        with pytest.raises(ValueError, match=re.escape(key)):
            update_lib.create("odsgd", model, sgd, None, **bad)
    with pytest.raises(ValueError, match=r"update\.odsgd\.local_lr.*LARS"):
        update_lib.create("odsgd", model, LARS(model.parameters(), lr=1.0), None)
    update_lib.create("odsgd", model, LARS(model.parameters(), lr=1.0), None, local_lr=0.01).remove_hooks()


def test_algorithm_options_from_config():
    from hpctrain.config.plugins import plugin_options
    from hpctrain.job.config import ConfigError, UpdateConfig, Config, validate
    assert plugin_options(UpdateConfig(), "ssgd") == {}
    opts = plugin_options(UpdateConfig(algorithm="odsgd", options={"odsgd": {"warmup_steps": 50, "local_lr": 0.01}}),
                          "odsgd")
    assert opts == {"warmup_steps": 50, "local_lr": 0.01, "local_momentum": 0.0, "dc_lambda": 0.0}
    cfg = Config()
    cfg.comm.delay_ms = -1.0
    with pytest.raises(ConfigError, match=r"config comm\.delay_ms: must be in \[0, 60000\], got -1.0"):
        validate(cfg)


def test_loss_scaling_overflow_skips_that_rounds_global_update_one_step_later():
    from hpctrain.optim.loss_scale import LossScaler
    steps, bad = 6, 3
    model = linear_model()
    scaler = LossScaler(init_scale=1024.0, growth_interval=1000)
    topo = Topology.create(MPI.COMM_SELF)
    tr = DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), topo, algorithm="odsgd",
                            algorithm_options={"warmup_steps": 1}, loss_fn=half_mse, scaler=scaler)
    batches = linear_batches(1, steps)
    batches[bad] = (batches[bad][0].clone().fill_(float("inf")), batches[bad][1])
    ref = hand_odsgd(model.weight.detach().numpy()[0].copy(), batches[:bad], 1, 1, [0.1] * bad, 0.0)
    for t, (x, y) in enumerate(batches[:bad + 2]):
        W_before = tr.algo.global_weights()[0].clone()
        r = tr.step(x, y)
        if t < bad:                 # scaled, then unscaled exactly (powers of two): the plain formulas
            np.testing.assert_allclose(model.weight.detach().numpy()[0], ref[t][1][0], rtol=0, atol=1e-13)
        if t == bad:                # own gradient not finite: no local step, ŵ = W; overflow not known yet
            assert not r.skipped and torch.equal(model.weight.detach(), tr.algo.global_weights()[0])
        if t == bad + 1:            # the round of step `bad` overflowed: W unchanged, scale backed off
            assert r.skipped and scaler.scale == 512.0
            assert torch.equal(tr.algo.global_weights()[0], W_before)
        assert torch.isfinite(model.weight).all()
    tr.close()
    topo.close()


@pytest.mark.parametrize("local_momentum", [0.0, 0.9])
def test_loss_scaled_local_step_selects_on_the_device_flag_with_the_same_values(monkeypatch, local_momentum):
    """issue 34, N6: where gradients live on a device, the local step of a rank whose gradient
    overflowed is skipped by a select on the device-side finite flag instead of a host read
    every step. Same weights and local momentum, bit for bit, as the branch on the host (taken
    here on the CPU through the seam), an inf batch included; the host check runs once per step
    fewer (only the global update's own-verdict check remains)."""
    from hpctrain.optim.loss_scale import LossScaler
    from hpctrain.update import odsgd

    def run(on_device):
        monkeypatch.setattr(odsgd, "flag_stays_on_device", lambda grads: on_device)
        calls = []
        real = odsgd.all_finite
        monkeypatch.setattr(odsgd, "all_finite", lambda ts: calls.append(1) or real(ts))
        model = linear_model()
        topo = Topology.create(MPI.COMM_SELF)
        tr = DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), topo, algorithm="odsgd",
                                algorithm_options={"warmup_steps": 1, "local_momentum": local_momentum},
                                loss_fn=half_mse, scaler=LossScaler(init_scale=1024.0, growth_interval=1000))
        batches = linear_batches(1, 6)
        batches[3] = (batches[3][0].clone().fill_(float("inf")), batches[3][1])
        for x, y in batches:
            tr.step(x, y)
        out = [model.weight.detach().clone(), tr.algo.global_weights()[0].clone()]
        out += [b.clone() for b in tr.algo._local_buf or []]
        tr.close()
        topo.close()
        return out, len(calls)
    host, host_reads = run(False)
    device, device_reads = run(True)
    assert all(torch.equal(a, b) for a, b in zip(host, device)) and len(host) == len(device)
    assert all(torch.isfinite(t).all() for t in device)
    assert device_reads == host_reads - 5       # 6 steps, 1 of warm-up: 5 local updates
