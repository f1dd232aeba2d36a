"""``optim.recipe = "auto"``: peak lr, warm-up, schedule and the optimiser's own options (LARS's
eta) from the global batch, the optimiser and whether the model normalises its activations
(docs/large-batch.md has the table).

This module is generic: each optimiser registers its own row in its own file
(``RECIPE_ROWS["lars"] = recipe_row`` in ``lars.py``), a function ``(global_batch, normalised) ->
Recipe``; :func:`recipe_for` asks the chosen optimiser for it and :func:`apply_recipe` returns the
``[optim]`` section with the row's values, never changing the one it is given. An optimiser with
no row (a plugin chosen as ``package.module:factory`` that registers none) is refused in one line
naming it: there is no generic row, since no lr suits every update rule (an AdamW lr is a
thousandth of LARS's).

Why the model matters: LARS and LAMB scale each layer's step to its weight norm, and with
BatchNorm (or Layer/Group/Instance norm) the loss does not change when a layer's weights are
scaled, so the growth of weight norms that such relative steps cause is harmless. Without
normalisation the logits scale with the product of the layer norms, so the BN-free rows take a
smaller relative step (each optimiser's file says how much and why).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import nn

from hpctrain.errors import ConfigError

from .registry import registered_name

__all__ = ["RECIPES", "Recipe", "RECIPE_ROWS", "recipe_for", "row_problem", "normalises", "apply_recipe"]

RECIPES = ("none", "auto")
S = TypeVar("S")                    # the [optim] section (a dataclass): apply_recipe returns one of its type
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)


@dataclass(frozen=True)
class Recipe:
    """One row of the table: what ``auto`` sets on the ``[optim]`` section, and the one-line reason."""
    lr: float                       # the peak itself (optim.scale_lr is set false) ...
    warmup_epochs: float
    schedule: str
    lr_1d_scale: float = 1.0
    base_batch: int | None = None   # ... unless given: lr is given at this batch and scaled linearly
    options: Mapping[str, object] = field(default_factory=dict)   # the optimiser's own ([optim.<name>])
    why: str = ""


RECIPE_ROWS: dict[str, Callable[[int, bool], Recipe]] = {}
"""Each optimiser's row, ``(global_batch, normalised) -> Recipe``, under the optimiser's registered
name; its own file fills it (``RECIPE_ROWS["lars"] = recipe_row``)."""

# The [optim] fields a row decides, in the order the start-up line names those it replaces; the
# row's own options ([optim.<name>] keys) are named after base_batch.
SHARED_BEFORE, SHARED_AFTER = ("lr", "scale_lr", "base_batch"), ("lr_1d_scale", "warmup", "warmup_epochs", "schedule")


def normalises(model: nn.Module) -> bool:
    """Does the model contain a BatchNorm, GroupNorm, LayerNorm, InstanceNorm or LRN layer?"""
    return any(isinstance(m, NORM_LAYERS) for m in model.modules())


def recipe_for(optimizer: str, global_batch: int, normalised: bool) -> Recipe:
    """The table row of ``optimizer`` (a registered name or ``package.module:factory``) at
    ``global_batch``; a ValueError where the name is unknown or registers no row."""
    if global_batch <= 0:
        raise ValueError(f"optim.recipe: global batch must be > 0, got {global_batch}")
    problem = row_problem(optimizer)
    if problem:
        raise ValueError(f"optim.recipe: {problem}")
    return RECIPE_ROWS[registered_name(optimizer)](global_batch, normalised)


def row_problem(optimizer: str) -> str | None:
    """Why ``optim.recipe = "auto"`` cannot serve ``optimizer`` (it registers no row), or None:
    the config's check, before any data is converted or a model built."""
    name = registered_name(optimizer)              # an unknown optimiser: one line naming the choices
    if name in RECIPE_ROWS:
        return None
    return (f"auto has no row for optimiser {optimizer!r} (rows: {', '.join(RECIPE_ROWS)}); set "
            f"optim.recipe = \"none\" and give its lr, warm-up and schedule")


def _value(o, key: str):
    """Field ``key`` of the section ``o``, or ``plugin.option`` from its sub-table (None: not given)."""
    if "." in key:
        plugin, _, name = key.partition(".")
        return o.options.get(plugin, {}).get(name)
    return getattr(o, key)


def _default(o, key: str):
    """The dataclass default of field ``key`` of the section ``o`` (None for a sub-table option)."""
    f = next((f for f in dataclasses.fields(o) if f.name == key), None)
    return None if f is None or f.default is dataclasses.MISSING else f.default


def apply_recipe(section: S, global_batch: int, model: nn.Module, epochs: float | None = None) -> tuple[S, str]:
    """``(new, line)``: with ``section.recipe == "auto"``, a copy of the ``[optim]`` section (a
    dataclass; ``section`` itself is left as it was) with the fields the optimiser's row decides
    (lr, scale_lr, base_batch, lr_1d_scale, warmup, warmup_epochs, schedule, and its own options in
    its sub-table, e.g. ``lars.eta``), and the start-up line saying what was chosen and why;
    ``(section, "")`` otherwise. ``epochs`` given: the warm-up is capped at half the run (a short test
    run still starts). A field the user set away from its default and the recipe changes is
    named in the line, so an override is never silent. An optimiser without a row: ConfigError."""
    o: Any = section
    if o.recipe != "auto":
        return section, ""
    try:
        r = recipe_for(o.name, global_batch, normalises(model))
    except ValueError as exc:                      # each names its key: "optim.recipe: ...", "optim.name: ..."
        raise ConfigError(f"config {exc}") from exc
    own = registered_name(o.name)                  # its sub-table: the registered name
    warmup, why = r.warmup_epochs, r.why
    if epochs is not None and warmup > epochs / 2:
        warmup = epochs / 2
        why += f" (warm-up capped at half the {epochs:g}-epoch run: {warmup:g})"
    options = {k: dict(v) for k, v in o.options.items()}
    if r.options:
        options[own] = {**options.get(own, {}), **r.options}           # [optim.<own>]: recorded as run
    new = dataclasses.replace(o, lr=r.lr, warmup="linear", warmup_epochs=warmup, schedule=r.schedule,
                              scale_lr=r.base_batch is not None, lr_1d_scale=r.lr_1d_scale, options=options,
                              **({} if r.base_batch is None else {"base_batch": r.base_batch}))
    decided = [*SHARED_BEFORE, *(f"{own}.{k}" for k in r.options), *SHARED_AFTER]
    replaced = [f"optim.{f}={_value(o, f)!r}" for f in decided
                if _value(o, f) != _default(o, f) and _value(o, f) != _value(new, f)]
    if replaced:
        why += f"; replaces {', '.join(replaced)} given in the config (optim.recipe = \"none\" keeps them)"
    return new, f"recipe auto ({o.name}, global batch {global_batch}): {why}"
