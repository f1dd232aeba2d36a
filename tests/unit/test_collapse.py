"""The collapse rule (hpctrain.ops.collapse) on loss curves: made-up ones with known answers,
noisy healthy ones that must never trigger, and per-step curves recorded from real runs
(tests/unit/data/loss_curves.json, written by scripts/record-loss-curves)."""
import json
import math
import os

import numpy as np
import pytest

from hpctrain.ops.collapse import (Collapse, CollapseDetector, CollapseRule, at_chance, chance_loss,
                                   detect_collapse, ended_at_chance, explain, explain_never_learned)

LN10 = math.log(10)
CURVES = os.path.join(os.path.dirname(__file__), "data", "loss_curves.json")


def healthy(n: int, start: float = LN10, floor: float = 0.05, tau: float = 60.0, noise: float = 0.0, seed: int = 0):
    """start → floor exponentially, times log-normal noise of relative size ``noise``."""
    rng = np.random.default_rng(seed)
    curve = floor + (start - floor) * np.exp(-np.arange(n) / tau)
    return curve * np.exp(noise * rng.standard_normal(n) - noise ** 2 / 2)


def collapsing(learn: int = 300, climb: int = 60, dead: int = 400, low: float = 0.38, noise: float = 0.02):
    """Learns to ``low`` over ``learn`` steps, climbs back to ln 10 over ``climb``, then sits there."""
    rng = np.random.default_rng(1)
    down = low + (LN10 - low) * np.exp(-np.arange(learn) / (learn / 6))
    up = np.linspace(down[-1], LN10, climb)
    flat = np.full(dead, LN10)
    curve = np.concatenate([down, up, flat])
    return curve * np.exp(noise * rng.standard_normal(curve.size))


def test_chance_is_ln_classes_and_at_chance_uses_the_threshold():
    assert chance_loss(10) == pytest.approx(2.302585, abs=1e-6) and chance_loss(2) == pytest.approx(math.log(2))
    assert at_chance(2.30, 10) and at_chance(2.1, 10) and not at_chance(2.0, 10)     # 0.9 ln 10 = 2.072
    assert at_chance(float("nan"), 10) and at_chance(7.0, 10)
    with pytest.raises(ValueError):
        chance_loss(1)


def test_a_collapse_is_found_where_it_turned_and_after_the_stated_steps():
    curve = collapsing()
    rule = CollapseRule(LN10, steps=100)
    c = detect_collapse(curve, rule)
    assert c is not None
    # independent computation: the same EMA by a plain loop
    ema, emas = curve[0], []
    for x in curve:
        ema = ema + (x - ema) / rule.smoothing
        emas.append(ema)
    emas = np.array(emas)
    since = int(np.argmax((emas >= 0.9 * LN10) & (np.arange(emas.size) > 200)))
    assert c.chance_since == since and c.step == since + 99            # 100 steps at chance, counted from since
    assert c.turned_step == int(np.argmin(emas[:since])) and c.lowest_loss == pytest.approx(emas[:since].min())
    assert 280 <= c.turned_step <= 310                                 # the bottom of the made-up curve is at 300
    assert c.smoothed_loss >= 0.9 * LN10 and c.chance == LN10


def test_fewer_steps_at_chance_than_stated_is_no_collapse():
    curve = collapsing(dead=40)        # ~45 steps with the EMA at chance, rule asks 100
    assert detect_collapse(curve, CollapseRule(LN10, steps=100)) is None
    assert detect_collapse(curve, CollapseRule(LN10, steps=20)) is not None


@pytest.mark.parametrize("noise", [0.0, 0.1, 0.3, 0.6])
@pytest.mark.parametrize("seed", range(3))
def test_noisy_healthy_curves_never_trigger(noise, seed):
    curve = healthy(3000, noise=noise, seed=seed)
    assert detect_collapse(curve, CollapseRule(LN10, steps=100)) is None
    assert detect_collapse(curve, CollapseRule(LN10, steps=10)) is None


def test_a_spike_the_run_recovers_from_is_no_collapse():
    curve = healthy(1000, noise=0.1)
    curve[400:450] = 3.5                                  # 50 steps far above chance, then back to training
    assert detect_collapse(curve, CollapseRule(LN10, steps=100)) is None
    c = detect_collapse(curve, CollapseRule(LN10, steps=30))
    assert c is not None and 400 <= c.chance_since < 420 and c.turned_step < 400


def test_a_run_that_never_learned_is_not_a_collapse():
    """A hard task near chance all along (or a slow start) is not this rule's business."""
    assert detect_collapse(np.full(2000, LN10), CollapseRule(LN10, steps=50)) is None
    slow = healthy(2000, floor=1.3, tau=400)                 # never at or below 0.5 ln 10 = 1.15
    assert detect_collapse(np.concatenate([slow, np.full(500, LN10)]), CollapseRule(LN10, steps=50)) is None


def fed(curve, rule):
    detector = CollapseDetector(rule)
    detector.feed(0, curve)
    return detector


def test_a_run_that_never_learned_ends_at_chance_once_it_had_the_warmup_and_the_steps():
    rule = CollapseRule(LN10, steps=50)
    flat = np.full(300, LN10)
    assert ended_at_chance(fed(flat, rule), 300, warmup_steps=250) == pytest.approx(LN10)
    assert ended_at_chance(fed(flat, rule), 299, warmup_steps=250) is None       # a short run is not judged
    dipped = np.concatenate([healthy(200, floor=1.6, tau=40), np.full(300, LN10)])  # 0.7 ln C, never 0.5: back
    assert ended_at_chance(fed(dipped, rule), 500, warmup_steps=0) is not None
    assert ended_at_chance(fed(healthy(2000, floor=1.3, tau=400), rule), 2000, 0) is None  # slow, but it moves
    assert ended_at_chance(fed(collapsing(), rule), 760, 0) is None                # learned: the collapse rule's
    armed = CollapseDetector(rule)
    armed.arm(0.4, 100)                                                            # resumed after it had learned
    armed.feed(0, flat)
    assert ended_at_chance(armed, 300, 0) is None
    line = explain_never_learned(2.301, LN10, 720, 0.1194, "lr 0.05 as given (optim.scale_lr=false)")
    assert "\n" not in line and line.startswith("training never left chance: after 720 steps the loss (smoothed) is 2.301")
    assert "ln C = 2.303" in line and "test accuracy 11.94%" in line and "lr 0.05 as given" in line


def test_non_finite_losses_are_skipped_and_feeding_in_pieces_matches_the_whole_curve():
    curve = collapsing()
    rule = CollapseRule(LN10, steps=100)
    whole = detect_collapse(curve, rule)
    d = CollapseDetector(rule)
    verdict = None
    for start in range(0, curve.size, 37):                     # the job flushes in pieces
        verdict = verdict or d.feed(start, curve[start:start + 37])
    assert verdict == whole
    with_nan = np.insert(curve, 10, [np.nan, np.inf])          # two skipped steps shift the steps by 2
    c = detect_collapse(with_nan, rule)
    assert c is not None and c.step == whole.step + 2


def test_the_rule_is_checked():
    for bad in (dict(chance=0.0), dict(chance=1.0, steps=0), dict(chance=1.0, learned_below=0.95),
                dict(chance=1.0, smoothing=0.5)):
        with pytest.raises(ValueError):
            CollapseRule(**bad)


def test_the_line_names_epoch_step_lr_and_the_rule_in_use():
    c = Collapse(turned_step=133, lowest_loss=0.38, chance_since=170, step=269, smoothed_loss=2.30, chance=LN10)
    line = explain(c, steps_per_epoch=7, lr_of=lambda s: 0.01 * s, warmup_steps=35, lr_line="recipe auto (lamb)")
    assert "\n" not in line
    assert "epoch 19 step 133" in line and "epoch 24 step 170" in line and "epoch 38 step 269" in line
    assert "1.33 at the turn, after the warm-up (35 steps)" in line and "recipe auto (lamb)" in line
    assert "ln C = 2.303" in line and "optim.lr" in line and "optim.warmup_epochs" in line
    assert "in the warm-up, which ends at step 500" in explain(c, 7, lambda s: 1.0, 500, "x")


@pytest.mark.skipif(not os.path.exists(CURVES), reason="no recorded curves")
def test_recorded_curves():
    """Per-step losses of real runs (rank-averaged, as the job feeds them): the healthy ones never
    trigger, the one made to collapse does, at its recorded turn."""
    with open(CURVES) as fh:
        doc = json.load(fh)
    for name, rec in doc["curves"].items():
        c = detect_collapse(rec["loss"], CollapseRule(chance_loss(rec["classes"]), steps=rec.get("rule_steps", 100)))
        if rec["collapses"]:
            assert c is not None, name
            assert c.turned_step < c.chance_since <= c.step, name
        else:
            assert c is None, (name, c)
            rule = CollapseRule(chance_loss(rec["classes"]), steps=rec.get("rule_steps", 100))
            assert ended_at_chance(fed(rec["loss"], rule), len(rec["loss"]), 0) is None, name


def test_a_collapse_is_recorded_as_collapsed_and_read_back_as_status_6(tmp_path):
    from hpctrain.errors import TrainingCollapsed
    from hpctrain.ops import runstate
    exit_ = runstate.record_exit(str(tmp_path), enabled=True)
    exit_(TrainingCollapsed, TrainingCollapsed("training collapsed: the loss ..."), None)
    assert runstate.read(str(tmp_path))["state"] == "collapsed"
    line, code = runstate.describe(str(tmp_path))
    assert code == 6 == TrainingCollapsed.exit_status and line.startswith("collapsed: training collapsed: the loss")
    exit_(ValueError, ValueError("x"), None)                      # anything else is still "failed", status 2
    assert runstate.describe(str(tmp_path))[1] == 2


def test_a_resumed_dead_network_is_still_caught():
    """A checkpoint written while the run was dying holds a network that never learns again: fresh,
    the rule would never fire (it must learn first); armed from the run's history it does."""
    from hpctrain.ops.collapse import learned_before
    rule = CollapseRule(chance_loss(10), steps=20)
    history = [{"event": "epoch", "step": 50, "train_loss": 2.1}, {"event": "epoch", "step": 100, "train_loss": 0.4},
               {"event": "collapsed", "step": 130}, {"event": "epoch", "step": 150, "train_loss": float("nan")}]
    dead = [math.log(10)] * 60
    assert detect_collapse(dead, rule, first_step=150) is None                 # fresh: never learned
    armed = CollapseDetector(rule)
    armed.arm(*learned_before(history, rule))
    verdict = armed.feed(150, dead)
    assert verdict is not None and verdict.turned_step == 100 and verdict.chance_since == 150
    assert learned_before(history[:1], rule) is None                          # never below 0.5 ln C
    assert learned_before([], rule) is None
