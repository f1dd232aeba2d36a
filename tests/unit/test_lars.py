"""LARS against an independent NumPy implementation and against torch.optim.SGD."""
import copy

import numpy as np
import pytest
import torch

from hpctrain.optim import LARS, make_optimizer, trust_ratio
from hpctrain.optim.lars_backends import _kernels_norms, resolve_norms_fn

torch.set_num_threads(1)


def numpy_lars(ws, grads_per_step, *, lr, m, wd, eta, eps, nesterov=False, clip=False,
               exclude_1d=True):
    """Reference: the formula of You et al. / MLPerf written out per layer in float64."""
    ws = [w.astype(np.float64).copy() for w in ws]
    vs = [np.zeros_like(w) for w in ws]
    for grads in grads_per_step:
        for i, (w, g) in enumerate(zip(ws, grads)):
            if exclude_1d and w.ndim <= 1:
                lam, d = 1.0, g
            else:
                wn, gn = np.linalg.norm(w), np.linalg.norm(g)
                if wn > 0 and gn > 0:
                    lam = eta * wn / (gn + wd * wn + eps)
                    if clip:
                        lam = min(lam / lr, 1.0)
                else:
                    lam = 1.0
                d = g + wd * w
            u = lr * lam * d
            vs[i] = m * vs[i] + u
            ws[i] = w - (u + m * vs[i] if nesterov else vs[i])
    return ws


def make_case(seed=0):
    rng = np.random.default_rng(seed)
    ws = [rng.normal(size=(4, 3)), rng.normal(size=(2, 3, 3, 3)),
          np.zeros((3, 5)),                 # zero weight: lambda = 1 on the first step
          rng.normal(size=(5, 2)),          # gets a zero gradient on step 1
          rng.normal(size=(4,))]            # 1-D: excluded
    steps = []
    for k in range(4):
        grads = [rng.normal(size=w.shape) for w in ws]
        if k == 1:
            grads[3] = np.zeros_like(ws[3])
        steps.append(grads)
    return ws, steps


def run_torch(opt_factory, ws, steps):
    params = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float64)) for w in ws]
    opt = opt_factory(params)
    for grads in steps:
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return [p.detach().numpy() for p in params], opt


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("clip", [False, True])
def test_lars_matches_numpy_formula(nesterov, clip):
    ws, steps = make_case()
    hp = dict(lr=0.7, m=0.9, wd=5e-4, eta=0.02, eps=1e-9)
    got, opt = run_torch(lambda ps: LARS(ps, lr=hp["lr"], momentum=hp["m"],
                                         weight_decay=hp["wd"], eta=hp["eta"], eps=hp["eps"],
                                         nesterov=nesterov, clip=clip), ws, steps)
    want = numpy_lars(ws, steps, nesterov=nesterov, clip=clip, **hp)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    # the case is not trivial: LARS moved the weights differently from plain SGD
    plain = numpy_lars(ws, steps, nesterov=nesterov, clip=clip, **{**hp, "eta": 1e9})
    assert not np.allclose(got[0], plain[0])


def test_trust_ratio_zero_norms_and_value():
    w = torch.tensor([0.0, 2.0, 3.0, 0.0])
    g = torch.tensor([1.0, 0.0, 4.0, 0.0])
    r = trust_ratio(w, g, eta=0.001, weight_decay=0.1, eps=0.0)
    assert r[0] == 1 and r[1] == 1 and r[3] == 1
    assert r[2].item() == pytest.approx(0.001 * 3 / (4 + 0.1 * 3))
    clipped = trust_ratio(w, g, eta=10.0, weight_decay=0.0, eps=0.0, clip_lr=2.0)
    assert clipped[2].item() == 1.0 and clipped[0].item() == 1.0   # min(7.5/2, 1)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("exclude_1d", [False, True])
def test_without_trust_ratio_equals_torch_sgd(nesterov, exclude_1d):
    """Trust ratio off: LARS is momentum SGD (constant lr: lr inside/outside v agree)."""
    ws, steps = make_case(1)
    lars_f = lambda ps: LARS(ps, lr=0.3, momentum=0.9, weight_decay=1e-3, nesterov=nesterov,
                             trust_ratio=False, exclude_1d=exclude_1d)

    def sgd_f(ps):
        if exclude_1d:
            groups = [{"params": [p for p in ps if p.ndim > 1]},
                      {"params": [p for p in ps if p.ndim <= 1], "weight_decay": 0.0}]
        else:
            groups = ps
        return torch.optim.SGD(groups, lr=0.3, momentum=0.9, weight_decay=1e-3,
                               nesterov=nesterov)

    got, _ = run_torch(lars_f, ws, steps)
    want, _ = run_torch(sgd_f, ws, steps)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5),
                                torch.nn.Linear(5, 2))
    x, y = torch.randn(16, 6), torch.randint(0, 2, (16,))

    def train(m, opt, n):
        for _ in range(n):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()

    opt = make_optimizer(model, "lars", lr=2.0, weight_decay=1e-4, eta=0.01)
    train(model, opt, 3)
    clone = copy.deepcopy(model)
    opt2 = make_optimizer(clone, "lars", lr=99.0, weight_decay=0.5, eta=0.5)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert opt2.param_groups[0]["lr"] == 2.0
    train(model, opt, 3)
    train(clone, opt2, 3)
    for a, b in zip(model.parameters(), clone.parameters()):
        assert torch.equal(a, b)


def test_make_optimizer_sgd_excludes_1d_from_weight_decay():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    opt = make_optimizer(model, "sgd", lr=0.1, weight_decay=1e-4)
    decays = {p.ndim: g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decays == {4: 1e-4, 1: 0.0}
    with pytest.raises(ValueError):
        make_optimizer(model, "adam", lr=0.1)


def test_kernels_adapter_and_backend_choice():
    torch.manual_seed(0)
    ts = [torch.randn(3, 4), torch.randn(7)]                 # fp32: the kernel's contract
    want = [np.linalg.norm(t.double().numpy()) for t in ts]
    calls = []

    def fake_kernel(tensors):
        calls.append(len(tensors))
        sq = [float((t.double().numpy() ** 2).sum()) for t in tensors]
        return sq, float(np.sqrt(sum(sq)))

    adapted = _kernels_norms(fake_kernel)
    np.testing.assert_allclose(adapted(ts).numpy(), want, rtol=1e-6)
    ts64 = [t.double() for t in ts]                           # not fp32: torch fall-back
    np.testing.assert_allclose(adapted(ts64).numpy(), want, rtol=1e-12)
    assert calls == [2]
    for prefer in (True, False):
        fn, backend = resolve_norms_fn(prefer_kernels=prefer)
        np.testing.assert_allclose(fn(ts).numpy(), want, rtol=1e-5)
        np.testing.assert_allclose(fn(ts64).numpy(), want, rtol=1e-12)
        assert backend.startswith(("kernels.", "torch._foreach_norm"))
    assert resolve_norms_fn(prefer_kernels=False)[1] == "torch._foreach_norm"


def test_lars_float32_with_default_backend_matches_numpy():
    """fp32 parameters take the kernels path when the package is present."""
    ws, steps = make_case(2)
    params = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float32)) for w in ws]
    opt = LARS(params, lr=0.7, momentum=0.9, weight_decay=5e-4, eta=0.02, eps=1e-9)
    for grads in steps:
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    want = numpy_lars(ws, steps, lr=0.7, m=0.9, wd=5e-4, eta=0.02, eps=1e-9)
    for p, w in zip(params, want):
        np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("clip", [False, True])
def test_fused_update_equals_foreach_path(nesterov, clip, monkeypatch):
    """``kernels.lars_update`` (here its CPU reference, as forced by ``fused_update=True``; on a
    GPU the CUDA kernel) gives the ``_foreach`` path's weights and momentum, fp32, over steps
    with trust-ratio, weight-decay-only and excluded 1-D groups (issue 22, finding 6)."""
    from hpctrain import kernels
    calls = []
    real = kernels.lars_update
    monkeypatch.setattr(kernels, "lars_update", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
    ws, steps = make_case(2)

    def run(fused):
        params = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float32)) for w in ws]
        groups = [{"params": params[:2]}, {"params": params[2:], "trust_ratio": False}]
        opt = LARS(groups, lr=0.7, momentum=0.9, weight_decay=5e-4, eta=0.02, eps=1e-9, nesterov=nesterov,
                   clip=clip, fused_update=fused)
        for grads in steps:
            for p, g in zip(params, grads):
                p.grad = torch.tensor(g, dtype=torch.float32)
            opt.step()
        return params, [opt.state[p]["momentum_buffer"] for p in params], opt

    fused, fused_v, opt = run(True)
    # per step: the trust-ratio group, the weight-decay group (none here) and the excluded 1-D one
    assert calls and len(calls) == 3 * len(steps) and opt.update_backend.startswith("kernels.lars_update")
    plain, plain_v, _ = run(False)
    assert len(calls) == 3 * len(steps)             # the foreach run never called the kernel
    for a, b in zip(fused + fused_v, plain + plain_v):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-7)
    assert not torch.equal(fused[0], torch.tensor(ws[0], dtype=torch.float32))


def test_cpu_tensors_keep_the_foreach_path_by_default():
    p = torch.nn.Parameter(torch.ones(4, 3))
    opt = LARS([p], lr=0.1)
    assert not opt._use_kernel([p], [torch.ones(4, 3)])       # CPU tensors: never by default
    assert "torch._foreach" in opt.update_backend or "CUDA tensors" in opt.update_backend


def test_lr_1d_scale_scales_only_the_excluded_parameters():
    """lr_1d_scale = s: the 1-D parameter moves as momentum SGD at lr*s (numpy_lars with lr*s), the
    others exactly as with s = 1."""
    ws, steps = make_case()
    hp = dict(lr=0.7, m=0.9, wd=5e-4, eta=0.02, eps=1e-9)
    got, _ = run_torch(lambda ps: LARS(ps, lr=hp["lr"], momentum=hp["m"], weight_decay=hp["wd"],
                                       eta=hp["eta"], eps=hp["eps"], lr_1d_scale=0.1), ws, steps)
    want = numpy_lars(ws, steps, **hp)
    want_1d = numpy_lars(ws, steps, **{**hp, "lr": hp["lr"] * 0.1})
    for g, w in zip(got[:-1], want[:-1]):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[-1], want_1d[-1], rtol=1e-12, atol=1e-12)
    assert not np.allclose(got[-1], want[-1])
