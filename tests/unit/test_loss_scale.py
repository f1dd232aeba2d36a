"""Dynamic loss scaler: grow / halve / skip logic and the inf checks."""
import pytest
import torch

from hpctrain.optim import LossScaler, grads_have_inf, next_scale, unscale_and_check_


def test_grows_after_interval_of_clean_steps():
    s = LossScaler(init_scale=2.0 ** 10, growth_interval=3)
    assert [s.update(False) for _ in range(2)] == [True, True]
    assert s.scale == 2.0 ** 10 and s.good_steps == 2
    assert s.update(False) and s.scale == 2.0 ** 11 and s.good_steps == 0


def test_overflow_halves_skips_and_resets_counter():
    s = LossScaler(init_scale=2.0 ** 10, growth_interval=3)
    s.update(False), s.update(False)
    assert s.update(True) is False
    assert (s.scale, s.good_steps, s.n_skipped) == (2.0 ** 9, 0, 1)
    s.update(False), s.update(False)
    assert s.scale == 2.0 ** 9                     # counter restarted after the overflow
    s.update(False)
    assert s.scale == 2.0 ** 10


def test_bounds():
    s = LossScaler(init_scale=2.0, min_scale=1.0, max_scale=4.0, growth_interval=1)
    for _ in range(3):
        s.update(True)
    assert s.scale == 1.0
    for _ in range(5):
        s.update(False)
    assert s.scale == 4.0
    assert next_scale(8.0, 0, True, growth_interval=5) == (4.0, 0)
    with pytest.raises(ValueError):
        LossScaler(init_scale=0.5, min_scale=1.0)


def test_defaults_and_state_dict_round_trip():
    s = LossScaler()
    assert (s.scale, s.growth_interval) == (2.0 ** 16, 2000)
    s.update(True), s.update(False)
    t = LossScaler(init_scale=4.0)
    t.load_state_dict(s.state_dict())
    assert (t.scale, t.good_steps, t.n_skipped) == (2.0 ** 15, 1, 1)
    for _ in range(1999):
        s.update(False), t.update(False)
    assert s.scale == t.scale == 2.0 ** 16


def test_grads_have_inf_and_unscale():
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(2, 2))
    c = torch.nn.Parameter(torch.zeros(1))           # no gradient: skipped
    a.grad, b.grad = torch.tensor([2.0, 4.0, 8.0]), torch.ones(2, 2)
    assert grads_have_inf([a, b, c]) is False
    assert unscale_and_check_([a, b, c], 2.0) is False
    assert torch.equal(a.grad, torch.tensor([1.0, 2.0, 4.0]))
    b.grad[1, 0] = float("nan")
    assert grads_have_inf([a, b]) is True
    assert unscale_and_check_([a, b], 2.0) is True
    a.grad[0] = float("inf")
    b.grad = torch.ones(2, 2)
    assert grads_have_inf([a, b]) is True
    assert grads_have_inf([]) is False
