"""Learning-rate schedules: exact values at the phase boundaries, against hand formulas."""
import math

import pytest
import torch

from hpctrain.optim import (ScheduleSpec, linear_scaled_lr, lr_at, make_criterion,
                            mlperf_lars_base_lr, mlperf_lars_warmup_epochs, spec_from_config)

PEAK, END, W, T = 8.0, 1e-4, 10, 110


def spec(kind, **kw):
    return ScheduleSpec(peak_lr=PEAK, warmup_steps=W, total_steps=T, kind=kind, end_lr=END,
                        **kw)


@pytest.mark.parametrize("kind", ["constant", "step", "cosine", "poly"])
def test_warmup_is_linear_from_zero_and_monotone(kind):
    s = spec(kind, step_milestones=(50, 80))
    assert lr_at(0, s) == 0.0
    assert lr_at(5, s) == pytest.approx(PEAK * 5 / W)
    assert lr_at(W, s) == pytest.approx(PEAK)          # end of warm-up = peak for every kind
    lrs = [lr_at(i, s) for i in range(W + 1)]
    assert all(b > a for a, b in zip(lrs, lrs[1:]))


def test_constant():
    s = spec("constant")
    assert [lr_at(i, s) for i in (W, 60, T - 1, T + 5)] == [PEAK] * 4


def test_step():
    s = spec("step", step_milestones=(50, 80), step_gamma=0.1)
    assert lr_at(49, s) == PEAK
    assert lr_at(50, s) == pytest.approx(PEAK * 0.1)
    assert lr_at(79, s) == pytest.approx(PEAK * 0.1)
    assert lr_at(T - 1, s) == pytest.approx(PEAK * 0.01)


def test_cosine():
    s = spec("cosine")
    span = T - W
    assert lr_at(W + span // 2, s) == pytest.approx(END + (PEAK - END) * 0.5)
    assert lr_at(T - 1, s) == pytest.approx(
        END + (PEAK - END) * 0.5 * (1 + math.cos(math.pi * (span - 1) / span)))
    assert lr_at(T + 10, s) == pytest.approx(END)


def test_poly_matches_mlperf_reference():
    """lars_util.py: decay_steps = train_steps - warmup_steps + 1, power 2."""
    s = spec("poly")
    ds = T - W + 1
    ref = lambda step: (PEAK - END) * (1 - min(step - W, ds) / ds) ** 2 + END  # noqa: E731
    for step in (W, W + 1, 60, T - 1):
        assert lr_at(step, s) == pytest.approx(ref(step), rel=1e-12)
    assert lr_at(60, s) == pytest.approx((PEAK - END) * (1 - 50 / 101) ** 2 + END)
    assert lr_at(T + 100, s) == pytest.approx(END)
    lrs = [lr_at(i, s) for i in range(W, T)]
    assert all(b < a for a, b in zip(lrs, lrs[1:]))


def test_hybrid_holds_peak_until_switch_then_decays():
    s = spec("poly", warmup="hybrid", hold_steps=20)
    assert lr_at(5, s) == pytest.approx(PEAK * 0.5)
    assert lr_at(W, s) == lr_at(W + 19, s) == PEAK
    ds = T - (W + 20) + 1
    assert lr_at(W + 20 + 30, s) == pytest.approx((PEAK - END) * (1 - 30 / ds) ** 2 + END)
    linear = spec("poly", warmup="linear", hold_steps=20)   # hold ignored without hybrid
    assert lr_at(W + 19, linear) < PEAK


def test_no_warmup_and_start_lr():
    s = spec("cosine", warmup="none")
    assert lr_at(0, s) == PEAK
    s2 = spec("constant", warmup_start_lr=1.0)
    assert lr_at(0, s2) == 1.0 and lr_at(5, s2) == pytest.approx(1.0 + 7.0 * 0.5)


def test_validation():
    with pytest.raises(ValueError):
        spec("exp")
    with pytest.raises(ValueError):
        ScheduleSpec(peak_lr=1, warmup_steps=20, total_steps=10)
    with pytest.raises(ValueError):
        lr_at(-1, spec("poly"))


def test_scaling_rules():
    assert linear_scaled_lr(0.1, 8192) == pytest.approx(3.2)
    assert [mlperf_lars_base_lr(b) for b in (8192, 16383, 16384, 32767, 32768, 81920)] == \
        [10.0, 10.0, 25.0, 25.0, 31.2, 31.2]
    assert [mlperf_lars_warmup_epochs(b) for b in (16384, 32767, 32768)] == [5.0, 5.0, 25.0]


def test_spec_from_config():
    s = spec_from_config(lr=0.1, global_batch=1024, steps_per_epoch=100, epochs=90,
                         warmup_epochs=5, kind="step", step_epochs=(30, 60, 80))
    assert (s.peak_lr, s.warmup_steps, s.total_steps) == (pytest.approx(0.4), 500, 9000)
    assert s.step_milestones == (3000, 6000, 8000)
    auto = spec_from_config(lr=None, global_batch=32768, steps_per_epoch=39, epochs=72,
                            warmup_epochs=None, optimizer="lars")
    assert (auto.peak_lr, auto.warmup_steps, auto.kind) == (31.2, 975, "poly")
    hybrid = spec_from_config(lr=2.0, scale_lr=False, global_batch=512, steps_per_epoch=10,
                              epochs=20, warmup_epochs=2, warmup="hybrid")
    assert (hybrid.peak_lr, hybrid.warmup_steps, hybrid.hold_steps) == (2.0, 20, 20)
    assert lr_at(39, hybrid) == 2.0 and lr_at(41, hybrid) < 2.0


def test_label_smoothing_matches_hand_formula():
    torch.manual_seed(0)
    logits, y, eps = torch.randn(6, 5, dtype=torch.float64), torch.tensor([0, 4, 2, 2, 1, 3]), 0.1
    logp = torch.log_softmax(logits, dim=1)
    k = logits.shape[1]
    target = torch.full_like(logp, eps / k)
    target[torch.arange(6), y] += 1 - eps
    want = -(target * logp).sum(1).mean()
    assert make_criterion(eps)(logits, y).item() == pytest.approx(want.item(), rel=1e-12)
    assert make_criterion(0.0)(logits, y).item() != pytest.approx(want.item(), rel=1e-3)
