"""optim.recipe = "auto": the documented table, the model check, what it sets and the start-up line."""
import copy
import dataclasses
import math

import pytest
import torch
from torch import nn

from hpctrain.job.config import Config, OptimConfig, validate
from hpctrain.errors import ConfigError
from hpctrain.models.resnet import resnet20
from hpctrain.models.small import MLP, SignalCNN, SmallCNN
from hpctrain.optim.recipe import RECIPE_ROWS, Recipe, apply_recipe, normalises, recipe_for
from hpctrain.optim.schedules import describe_lr


@pytest.mark.parametrize("batch,lr,warmup", [(512, 10.0, 5.0), (16383, 10.0, 5.0), (16384, 25.0, 5.0),
                                             (32767, 25.0, 5.0), (32768, 31.2, 25.0)])
def test_lars_normalised_rows_are_the_mlperf_table(batch, lr, warmup):
    r = recipe_for("lars", batch, normalised=True)
    assert (r.lr, r.options["eta"], r.warmup_epochs, r.schedule, r.lr_1d_scale) == (lr, 0.001, warmup, "poly", 1.0)


@pytest.mark.parametrize("batch", [2048, 16384, 65536])
def test_lars_bn_free_rows_keep_the_peak_relative_step_and_scale_the_1d_lr(batch):
    r = recipe_for("lars", batch, normalised=False)
    assert r.lr == recipe_for("lars", batch, normalised=True).lr          # MLPerf's lr and warm-up
    assert r.lr * r.options["eta"] == pytest.approx(0.05)                # 10 x 0.005 at every row
    assert r.lr_1d_scale == 0.01
    assert "BN-free" in r.why and f"eta {r.options['eta']:g}" in r.why


@pytest.mark.parametrize("batch,lr,bn_free_lr", [(512, 0.025, 0.025 / math.sqrt(8)), (2048, 0.05, 0.025 / math.sqrt(2)),
                                                 (4096, 0.05 * math.sqrt(2), 0.025), (8192, 0.1, 0.025 * math.sqrt(2)),
                                                 (65536, 0.1, 0.05)])
def test_lamb_square_root_scaling_capped(batch, lr, bn_free_lr):
    """Normalised: 0.05 at 2048, capped at 0.1; BN-free: 0.025 at 4096, capped at 0.05 (issue 38)."""
    for normalised, want in ((True, lr), (False, bn_free_lr)):
        r = recipe_for("lamb", batch, normalised)
        assert r.lr == pytest.approx(want) and r.options == {} and r.lr_1d_scale == 1.0
        assert r.warmup_epochs == (25.0 if batch >= 32768 else 5.0)
    assert "BN-free model: lr 0.025 x sqrt(4096/4096) = 0.025 (square-root" in recipe_for("lamb", 4096, False).why
    assert "(capped)" in recipe_for("lamb", 65536, False).why


def test_sgd_row_is_goyal_and_unknown_optimiser_refused():
    r = recipe_for("sgd", 8192, normalised=True)
    assert (r.lr, r.base_batch, r.warmup_epochs) == (0.1, 256, 5.0)
    assert "lr 0.1 x 8192/256 = 3.2" in r.why
    assert "use lars or lamb" in recipe_for("sgd", 16384, True).why
    with pytest.raises(ValueError, match="'adam'"):
        recipe_for("adam", 1024, True)


def test_normalises_finds_any_norm_layer():
    assert normalises(SmallCNN()) and normalises(resnet20())
    assert normalises(nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3)))
    assert normalises(nn.Sequential(nn.Conv1d(1, 4, 3), nn.GroupNorm(2, 4)))
    assert not normalises(SmallCNN(batchnorm=False))
    assert not normalises(SignalCNN()) and not normalises(MLP(num_classes=8, in_channels=32))


def test_apply_recipe_returns_the_section_and_the_startup_line_and_leaves_the_given_one():
    o = OptimConfig(name="lars", lr=0.3, scale_lr=True, warmup="none", schedule="cosine", recipe="auto")
    before = copy.deepcopy(o)
    new, line = apply_recipe(o, 4096, SignalCNN())
    assert o == before                                                     # never mutated
    assert (new.lr, new.scale_lr, new.warmup, new.warmup_epochs, new.schedule) == (10.0, False, "linear", 5.0, "poly")
    assert (new.options["lars"]["eta"], new.lr_1d_scale) == (0.005, 0.01)
    assert line.startswith("recipe auto (lars, global batch 4096): BN-free model: MLPerf lr 10")
    new, line = apply_recipe(OptimConfig(name="lars", recipe="auto"), 4096, SmallCNN())
    assert (new.options["lars"]["eta"], new.lr_1d_scale) == (0.001, 1.0)
    assert "MLPerf ResNet-50 table" in line


def test_recipe_names_the_values_it_replaces():
    """A user's own lr and warm-up are overridden by auto: the start-up line says which."""
    o = OptimConfig(name="lars", lr=0.3, warmup_epochs=2.0, recipe="auto")
    new, line = apply_recipe(o, 4096, SignalCNN())
    assert new.lr == 10.0 and new.warmup_epochs == 5.0
    assert line.endswith("; replaces optim.lr=0.3, optim.warmup_epochs=2.0 given in the config "
                         "(optim.recipe = \"none\" keeps them)")
    o = OptimConfig(name="lars", recipe="auto")                  # defaults only: nothing to name
    assert "replaces" not in apply_recipe(o, 4096, SignalCNN())[1]


def test_recipe_none_changes_nothing():
    o = OptimConfig(name="lars", lr=4.0, options={"lars": {"eta": 0.002}})
    before = dict(vars(o))
    assert apply_recipe(o, 4096, SignalCNN()) == (o, "")
    assert vars(o) == before
    assert describe_lr(o, 4096).startswith("lr 64 = 4 x 4096/256")


def test_recipe_then_optimiser_and_build_schedule():
    """What the job builds from apply_recipe's section: LARS with the recipe's eta and 1-D scale, a
    poly schedule peaking at the recipe's lr after its warm-up; the config records those values."""
    from hpctrain.job.setup import build_optimizer, build_schedule
    from hpctrain.optim import LARS, lr_at
    model = SignalCNN()
    cfg = Config(optim=OptimConfig(name="lars", recipe="auto"))
    o, _ = apply_recipe(cfg.optim, 2048, model)
    opt = build_optimizer(model, o)
    assert isinstance(opt, LARS) and opt.param_groups[0]["eta"] == 0.005 and opt.param_groups[0]["lr_1d_scale"] == 0.01
    spec = build_schedule(o, global_batch=2048, steps_per_epoch=8, epochs=30)
    assert (spec.peak_lr, spec.warmup_steps, spec.kind) == (10.0, 40, "poly")
    assert lr_at(40, spec) == pytest.approx(10.0) and lr_at(20, spec) == pytest.approx(5.0)
    recorded = dataclasses.replace(cfg, optim=o).to_dict()["optim"]       # what job.run writes as its config
    assert (recorded["lr"], recorded["scale_lr"], recorded["lr_1d_scale"], recorded["lars"]["eta"]) == (10.0, False,
                                                                                                       0.01, 0.005)
    assert cfg.to_dict()["optim"]["lr"] == 0.4 and cfg.to_dict()["optim"]["lars"]["eta"] == 0.001


def test_recipe_warmup_is_capped_at_half_a_short_run():
    new, line = apply_recipe(OptimConfig(name="lamb", recipe="auto"), 2048, MLP(num_classes=8, in_channels=32),
                             epochs=6)
    assert new.warmup_epochs == 3.0 and line.endswith("(warm-up capped at half the 6-epoch run: 3)")
    new, line = apply_recipe(OptimConfig(name="lamb", recipe="auto"), 2048, MLP(), epochs=60)
    assert not line.endswith(")") and new.warmup_epochs == 5.0


def test_an_optimiser_without_a_row_is_one_config_line_and_one_with_a_row_gets_it(plugin_sandbox, monkeypatch):
    """A plugin optimiser (``package.module:factory``) that registers no row: auto refuses it in one
    line naming it and the rows there are; ``none`` leaves it as given. Once its file registers a
    row, auto applies it, its own options in the sub-table of its registered name."""
    name = "examples.plugins.adamw_optimizer:adamw"
    with pytest.raises(ConfigError, match=r"^config optim\.recipe: auto has no row for optimiser "
                                          r"'examples\.plugins\.adamw_optimizer:adamw' \(rows: sgd, lars, lamb\); set "
                                          r"optim\.recipe = \"none\""):
        apply_recipe(OptimConfig(name=name, recipe="auto"), 1024, SignalCNN())
    assert apply_recipe(OptimConfig(name=name), 1024, SignalCNN())[1] == ""
    cfg = Config()
    cfg.optim = OptimConfig(name=name, recipe="auto")
    with pytest.raises(ConfigError, match=r"^config optim\.recipe: auto has no row"):
        validate(cfg)                      # at start-up: before data is converted or a model built
    cfg.optim.recipe = "none"
    validate(cfg)
    row = lambda batch, normalised: Recipe(lr=1e-3 * batch / 1024, warmup_epochs=2.0, schedule="cosine",  # noqa: E731
                                           options={"eps": 1e-8}, why=f"mine at {batch}")
    monkeypatch.setitem(RECIPE_ROWS, "adamw", row)
    new, line = apply_recipe(OptimConfig(name=name, recipe="auto"), 2048, SignalCNN())
    assert (new.lr, new.warmup_epochs, new.schedule, new.options) == (2e-3, 2.0, "cosine", {"adamw": {"eps": 1e-8}})
    assert line == f"recipe auto ({name}, global batch 2048): mine at 2048"
