"""LAMB against an independent NumPy transcription of You et al. 2019 (arXiv:1904.00962), Algorithm 2."""
import numpy as np
import pytest
import torch

from hpctrain.optim import LAMB, make_optimizer

torch.set_num_threads(1)


def numpy_lamb(xs, grads_per_step, *, lr, b1, b2, eps, wd, exclude_1d=True, lr_1d_scale=1.0):
    """Algorithm 2 per layer, float64: m_t, v_t, bias correction, r_t = m_hat/(sqrt(v_hat)+eps),
    x <- x - lr * phi(|x|)/|r + wd x| * (r + wd x) with phi the identity (ratio 1 when a norm is 0);
    excluded (1-D) layers take the Adam step lr*lr_1d_scale*r without decay or ratio."""
    xs = [x.astype(np.float64).copy() for x in xs]
    ms = [np.zeros_like(x) for x in xs]
    vs = [np.zeros_like(x) for x in xs]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g ** 2
            m_hat, v_hat = ms[i] / (1 - b1 ** t), vs[i] / (1 - b2 ** t)
            r = m_hat / (np.sqrt(v_hat) + eps)
            if exclude_1d and xs[i].ndim <= 1:
                xs[i] = xs[i] - lr * lr_1d_scale * r
                continue
            u = r + wd * xs[i]
            xn, un = np.linalg.norm(xs[i]), np.linalg.norm(u)
            ratio = xn / un if xn > 0 and un > 0 else 1.0
            xs[i] = xs[i] - lr * ratio * u
    return xs


def make_case(seed=0, steps=5):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(4, 3)), rng.normal(size=(2, 3, 3)) * 5,
          np.zeros((3, 5)),                       # zero weight: ratio 1 on the first step
          rng.normal(size=(6,))]                  # 1-D: excluded
    grads = [[rng.normal(size=x.shape) * (k + 1) for x in xs] for k in range(steps)]
    return xs, grads


def run_torch(opt, params, grads_per_step):
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return [p.detach().numpy() for p in params]


@pytest.mark.parametrize("exclude_1d,lr_1d_scale,wd", [(True, 1.0, 0.01), (True, 0.1, 0.0), (False, 1.0, 0.01)])
def test_lamb_matches_paper_transcription(exclude_1d, lr_1d_scale, wd):
    xs, grads = make_case()
    hp = dict(lr=0.05, b1=0.9, b2=0.99, eps=1e-6, wd=wd)
    params = [torch.nn.Parameter(torch.tensor(x)) for x in xs]
    opt = LAMB(params, lr=hp["lr"], betas=(hp["b1"], hp["b2"]), eps=hp["eps"], weight_decay=wd,
               exclude_1d=exclude_1d, lr_1d_scale=lr_1d_scale)
    got = run_torch(opt, params, grads)
    want = numpy_lamb(xs, grads, exclude_1d=exclude_1d, lr_1d_scale=lr_1d_scale, **hp)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    # not trivial: each layer moved by lr*|x| per step, unlike Adam's per-coordinate lr
    adam = torch.nn.Parameter(torch.tensor(xs[1]))
    plain = run_torch(torch.optim.Adam([adam], lr=hp["lr"], betas=(hp["b1"], hp["b2"]), eps=hp["eps"]),
                      [adam], [[g[1]] for g in grads])[0]
    assert not np.allclose(got[1], plain, atol=1e-3)


def test_lamb_layer_step_is_lr_times_weight_norm():
    """The trust ratio makes a layer's step norm lr*|x| whatever the gradient scale (wd = 0)."""
    for scale in (1e-4, 1e4):
        x = torch.nn.Parameter(torch.full((8, 8), 2.0, dtype=torch.float64))
        opt = LAMB([x], lr=0.01)
        before = x.detach().clone()
        x.grad = torch.randn(8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * scale
        opt.step()
        assert torch.linalg.vector_norm(x.detach() - before).item() == pytest.approx(0.01 * 16.0, rel=1e-9)


def test_make_optimizer_lamb_and_bad_values():
    model = torch.nn.Linear(3, 2)
    opt = make_optimizer(model, "lamb", lr=0.01, momentum=0.8, beta2=0.95, eps=1e-8, lr_1d_scale=0.5)
    assert isinstance(opt, LAMB)
    g = opt.param_groups[0]
    assert (g["betas"], g["eps"], g["lr_1d_scale"]) == ((0.8, 0.95), 1e-8, 0.5)
    with pytest.raises(ValueError, match="LAMB: invalid"):
        LAMB(model.parameters(), lr=0.01, betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="'adam'"):
        make_optimizer(model, "adam", lr=0.1)


def test_state_dict_round_trip_continues_identically():
    """A checkpointed LAMB (moments and step count) resumes on the same trajectory."""
    xs, grads = make_case(seed=1, steps=6)
    params = [torch.nn.Parameter(torch.tensor(x)) for x in xs]
    opt = LAMB(params, lr=0.05, weight_decay=0.01)
    straight = run_torch(opt, params, grads)
    params2 = [torch.nn.Parameter(torch.tensor(x)) for x in xs]
    opt2 = LAMB(params2, lr=0.05, weight_decay=0.01)
    run_torch(opt2, params2, grads[:3])
    params3 = [torch.nn.Parameter(p.detach().clone()) for p in params2]
    opt3 = LAMB(params3, lr=0.05, weight_decay=0.01)
    opt3.load_state_dict(opt2.state_dict())
    resumed = run_torch(opt3, params3, grads[3:])
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(a, b)
