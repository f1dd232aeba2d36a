"""SGD (``optim.name = "sgd"``): ``torch.optim.SGD`` with momentum, for global batches up to about
8K with the linear scaling rule and a 5-epoch warm-up (Goyal et al. 2017, "Accurate, Large
Minibatch SGD: Training ImageNet in 1 Hour", arXiv:1706.02677).

Everything hpctrain knows about SGD is here: its factory (no options of its own: no
``[optim.sgd]`` table), its row of the large-batch recipe (``optim.recipe = "auto"``). Where lr or
the warm-up is unset it takes the generic values (:data:`~hpctrain.optim.schedules.GOYAL_UNSET`,
which are Goyal's).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from .recipe import RECIPE_ROWS, Recipe
from .registry import OPTIMIZERS
from .schedules import linear_scaled_lr

__all__ = ["split_1d", "build", "recipe_row"]


def split_1d(params: Iterable[torch.nn.Parameter]) -> tuple[list, list]:
    """``(multi_dim, one_dim)``: weights vs BN gamma/beta and biases (``ndim <= 1``)."""
    params = list(params)
    return [p for p in params if p.ndim > 1], [p for p in params if p.ndim <= 1]


FUSED_DEVICES = ("cpu", "cuda")
"""Where ``torch.optim.SGD(fused=True)`` runs: one kernel over every tensor. torch's own default
on the CPU is a Python loop per parameter with separate passes for the momentum and the weight
(``foreach`` kernels are for GPUs only); fused reads weight, gradient and momentum once and
writes weight and momentum once, and gives the same bits (figures: docs/communication.md)."""


def fused_ok(params) -> bool:
    """May these parameters take the fused SGD kernel (floating point, on a device it serves)?"""
    return bool(params) and all(isinstance(p, torch.Tensor) and p.is_floating_point()
                                and p.device.type in FUSED_DEVICES for p in params)


@OPTIMIZERS.register("sgd")
def build(params, *, lr: float, momentum: float, weight_decay: float, nesterov: bool, exclude_1d: bool,
          **_) -> torch.optim.SGD:
    """``torch.optim.SGD`` (fused where :func:`fused_ok`); with ``exclude_1d`` two param groups,
    the 1-D one without weight decay."""
    params = list(params)
    fused = fused_ok(params) or None
    if exclude_1d:
        multi, one = split_1d(params)
        groups = [g for g in ({"params": multi}, {"params": one, "weight_decay": 0.0}) if g["params"]]
    else:
        groups = [{"params": params}]
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                           fused=fused)


def recipe_row(global_batch: int, normalised: bool) -> Recipe:
    """Goyal et al.: lr 0.1 at batch 256, linearly scaled, 5 warm-up epochs, cosine (with or
    without normalisation); above 8K the line points to LARS and LAMB."""
    return Recipe(lr=0.1, base_batch=256, warmup_epochs=5.0, schedule="cosine",
                  why=f"Goyal et al.: lr 0.1 x {global_batch}/256 = {linear_scaled_lr(0.1, global_batch):g}, "
                      f"5 warm-up epochs, cosine" + ("; above 8K use lars or lamb" if global_batch > 8192 else ""))


RECIPE_ROWS["sgd"] = recipe_row
