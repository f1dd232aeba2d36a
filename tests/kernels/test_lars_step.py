"""lars_update reference against the LARS formula of docs/large-batch.md in NumPy float64."""
import numpy as np
import pytest
import torch

from hpctrain import kernels


def numpy_lars(w, g, v, step, wd, m, nesterov):
    w, g, v = (x.astype(np.float64) for x in (w, g, v))
    u = step * (g + wd * w)
    v = m * v + u
    return (w - u - m * v if nesterov else w - v), v


def make(rng, shapes):
    return ([rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3))


SHAPES = [(3,), (0,), (64, 3, 3, 3), (1000,), (200_003,)]


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("wd, m", [(0.0, 0.9), (5e-5, 0.9), (1e-4, 0.0)])
@pytest.mark.parametrize("per_tensor", [False, True])
def test_matches_formula(nesterov, wd, m, per_tensor):
    rng = np.random.default_rng(7)
    ws, gs, vs = make(rng, SHAPES)
    steps = (rng.uniform(0.01, 2.0, len(SHAPES)) if per_tensor else np.full(len(SHAPES), 0.3))
    steps = steps.astype(np.float32)
    params = [torch.from_numpy(w.copy()) for w in ws]
    bufs = [torch.from_numpy(v.copy()) for v in vs]
    step = torch.from_numpy(steps) if per_tensor else 0.3
    kernels.lars_update(params, [torch.from_numpy(g) for g in gs], bufs, step, wd, m, nesterov)
    for i, (w, g, v) in enumerate(zip(ws, gs, vs)):
        want_w, want_v = numpy_lars(w, g, v, float(steps[i]), wd, m, nesterov)
        np.testing.assert_allclose(bufs[i].numpy(), want_v, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(params[i].numpy(), want_w, rtol=1e-5, atol=1e-6)


def test_first_step_from_zero_momentum_is_sgd():
    w, g = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.25])
    v = torch.zeros(2)
    kernels.lars_update([w], [g], [v], torch.tensor([0.1]), 0.0, 0.9)
    assert torch.allclose(w, torch.tensor([0.95, -2.025])) and torch.allclose(v, 0.1 * g)


def test_numpy_inputs_are_updated_in_place():
    w, g, v = np.ones(4, np.float32), np.ones(4, np.float32), np.zeros(4, np.float32)
    kernels.lars_update([w], [g], [v], np.array([0.5], np.float32), 0.0, 0.9)
    np.testing.assert_array_equal(w, 0.5)


@pytest.mark.parametrize("bad", ["lengths", "shape", "step_len", "dtype"])
def test_bad_arguments(bad):
    w, g, v = [torch.ones(4)], [torch.ones(4)], [torch.zeros(4)]
    step = torch.ones(1)
    if bad == "lengths":
        g = g * 2
    elif bad == "shape":
        g = [torch.ones(2, 2)]
    elif bad == "step_len":
        step = torch.ones(2)
    else:
        v = [torch.zeros(4, dtype=torch.float64)]
    with pytest.raises((ValueError, TypeError)):
        kernels.lars_update(w, g, v, step, 0.0, 0.9)
