"""``optim.recipe = "auto"``: peak lr, eta, warm-up and schedule from the global batch, the
optimiser and whether the model normalises its activations (docs/large-batch.md has the table).

Why the model matters: LARS and LAMB scale each layer's step to its weight norm, and with
BatchNorm (or Layer/Group/Instance norm) the loss does not change when a layer's weights are
scaled, so the growth of weight norms that such relative steps cause is harmless. Without
normalisation the logits scale with the product of the layer norms; a relative step large
enough to train in few large-batch steps then makes them grow until the loss spikes, and the
1-D parameters excluded from the trust ratio (biases) take the raw peak lr (10 in the MLPerf
table) and blow up. The BN-free rows therefore use a moderate LARS eta and give the 1-D
parameters ``lr * lr_1d_scale``; BN-free LAMB takes a third of the normalised relative step (its
Adam direction points along the weights there, so the norms grow at about lr per step: issue 38).
The normalised rows are MLPerf's ResNet-50 table unchanged.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from torch import nn

from .schedules import linear_scaled_lr, mlperf_lars_base_lr, mlperf_lars_warmup_epochs

__all__ = ["RECIPES", "Recipe", "recipe_for", "normalises", "apply_recipe"]

RECIPES = ("none", "auto")
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)

# BN-free LARS: eta such that the peak relative step lr*eta is 0.05 at the MLPerf lr (10 below 16K)
BN_FREE_LARS_ETA = 0.005
BN_FREE_LR_1D_SCALE = 0.01          # biases step at lr/100 (0.1 at the peak lr 10)
LAMB_BASE_LR, LAMB_BASE_BATCH = 0.05, 2048        # square-root scaling from here (You et al. 2019)
LAMB_MAX_LR = 0.1
# BN-free LAMB: about a third of the normalised row's relative step. Issue 38: at 0.0707 (batch 4096)
# LAMB's update points along the weights (cosine +0.3..0.9), every norm grows ~lr*cos per step
# until a layer's ReLUs are all dead and the loss sits at ln C; 0.025 trained (docs/large-batch.md).
# One seed per set, batch 2048-4096: the cap above 4096 is not measured.
LAMB_BN_FREE_BASE_LR, LAMB_BN_FREE_BASE_BATCH = 0.025, 4096
LAMB_BN_FREE_MAX_LR = 0.05


DECIDES = ("lr", "scale_lr", "base_batch", "lars.eta", "lr_1d_scale", "warmup", "warmup_epochs", "schedule")


def _value(o, key: str):
    """Field ``key`` of the section ``o``, or ``plugin.option`` from its sub-table (None: not given)."""
    if "." in key:
        plugin, _, name = key.partition(".")
        return getattr(o, "options", {}).get(plugin, {}).get(name)
    return getattr(o, key, None)


def _default(o, name: str):
    """The dataclass default of field ``name`` of the section ``o`` (None when it has none, as a
    sub-table option not given)."""
    f = next((f for f in dataclasses.fields(o) if f.name == name), None) if dataclasses.is_dataclass(o) else None
    return None if f is None or f.default is dataclasses.MISSING else f.default


@dataclass(frozen=True)
class Recipe:
    """What ``auto`` sets on the ``[optim]`` section, and the one-line reason."""
    lr: float                       # the peak itself (optim.scale_lr is set false)
    warmup_epochs: float
    schedule: str
    eta: float | None = None        # LARS only
    lr_1d_scale: float = 1.0
    base_batch: int | None = None   # SGD only: lr is given at this batch and scaled linearly
    why: str = ""


def normalises(model: nn.Module) -> bool:
    """Does the model contain a BatchNorm, GroupNorm, LayerNorm, InstanceNorm or LRN layer?"""
    return any(isinstance(m, NORM_LAYERS) for m in model.modules())


def recipe_for(optimizer: str, global_batch: int, normalised: bool) -> Recipe:
    """The table row for ``optimizer`` at ``global_batch`` (docs/large-batch.md)."""
    if global_batch <= 0:
        raise ValueError(f"global batch must be > 0, got {global_batch}")
    kind = "normalised" if normalised else "BN-free"
    if optimizer == "sgd":
        return Recipe(lr=0.1, base_batch=256, warmup_epochs=5.0, schedule="cosine",
                      why=f"Goyal et al.: lr 0.1 x {global_batch}/256 = {linear_scaled_lr(0.1, global_batch):g}, "
                          f"5 warm-up epochs, cosine" + ("; above 8K use lars or lamb" if global_batch > 8192 else ""))
    if optimizer == "lars":
        lr, warmup = mlperf_lars_base_lr(global_batch), mlperf_lars_warmup_epochs(global_batch)
        if normalised:
            return Recipe(lr=lr, warmup_epochs=warmup, schedule="poly", eta=0.001,
                          why=f"MLPerf ResNet-50 table, {kind} model: lr {lr:g}, eta 0.001, {warmup:g} warm-up "
                              f"epochs, poly")
        eta = BN_FREE_LARS_ETA * 10.0 / lr          # the same peak relative step lr*eta at every row
        return Recipe(lr=lr, warmup_epochs=warmup, schedule="poly", eta=eta, lr_1d_scale=BN_FREE_LR_1D_SCALE,
                      why=f"{kind} model: MLPerf lr {lr:g} and {warmup:g} warm-up epochs, eta {eta:g} "
                          f"(peak relative step {lr * eta:g}), 1-D params at lr x {BN_FREE_LR_1D_SCALE:g}, poly")
    if optimizer == "lamb":
        base, base_batch, cap = ((LAMB_BASE_LR, LAMB_BASE_BATCH, LAMB_MAX_LR) if normalised else
                                 (LAMB_BN_FREE_BASE_LR, LAMB_BN_FREE_BASE_BATCH, LAMB_BN_FREE_MAX_LR))
        lr = min(base * math.sqrt(global_batch / base_batch), cap)
        warmup = mlperf_lars_warmup_epochs(global_batch)
        return Recipe(lr=lr, warmup_epochs=warmup, schedule="poly",
                      why=f"{kind} model: lr {base:g} x sqrt({global_batch}/{base_batch}) = {lr:.4g}"
                          f"{' (capped)' if lr == cap else ''} (square-root scaling), {warmup:g} "
                          f"warm-up epochs, poly")
    raise ValueError(f"optim.recipe auto: no recipe for optimizer {optimizer!r}")


def apply_recipe(o, global_batch: int, model: nn.Module, epochs: float | None = None) -> str:
    """With ``o.recipe == "auto"``, overwrite the ``[optim]`` fields the recipe decides (lr,
    scale_lr, base_batch, ``lars.eta`` in the sub-table, lr_1d_scale, warmup, warmup_epochs,
    schedule) and return the start-up line saying what was chosen and why (also kept as ``o.recipe_line`` for
    :func:`~hpctrain.optim.schedules.describe_lr`); ``""`` and nothing changed otherwise.
    ``epochs`` given: the warm-up is capped at half the run (a short test run still starts).
    A field the user set away from its default and the recipe changes is named in the line, so
    an override is never silent."""
    if getattr(o, "recipe", "none") != "auto":
        return ""
    before = {f: _value(o, f) for f in DECIDES}
    r = recipe_for(o.name, global_batch, normalises(model))
    warmup, why = r.warmup_epochs, r.why
    if epochs is not None and warmup > epochs / 2:
        warmup = epochs / 2
        why += f" (warm-up capped at half the {epochs:g}-epoch run: {warmup:g})"
    o.lr, o.warmup, o.warmup_epochs, o.schedule = r.lr, "linear", warmup, r.schedule
    o.scale_lr = r.base_batch is not None
    if r.base_batch is not None:
        o.base_batch = r.base_batch
    if r.eta is not None:
        o.options.setdefault("lars", {})["eta"] = r.eta        # [optim.lars] eta: recorded as run
    o.lr_1d_scale = r.lr_1d_scale
    replaced = [f"optim.{f}={v!r}" for f, v in before.items() if v != _default(o, f) and v != _value(o, f)]
    if replaced:
        why += f"; replaces {', '.join(replaced)} given in the config (optim.recipe = \"none\" keeps them)"
    o.recipe_line = f"recipe auto ({o.name}, global batch {global_batch}): {why}"
    return o.recipe_line
