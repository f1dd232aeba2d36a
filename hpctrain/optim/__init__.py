"""Optimisers, learning-rate schedules and loss scaling.

=======  =====================================================================================
name     when to use
=======  =====================================================================================
sgd      global batch up to ~8K with the linear scaling rule and 5-epoch warm-up (Goyal et al.
         2017); no weight decay on 1-D parameters (BN gamma/beta, biases) when ``exclude_1d``.
lars     larger batches (MLPerf ResNet-50 recipe: ``lars`` + ``poly`` schedule, peak lr from
         ``mlperf_lars_base_lr``); per-layer trust ratios, 1-D parameters excluded (their lr is
         ``lr * lr_1d_scale``: lower it on a BN-free net, docs/large-batch.md).
lamb     the same batches with Adam's moments under the trust ratio (You et al. 2019); ``lr`` is
         the relative step per layer (about 0.05 at batch 2K, square-root scaled).
=======  =====================================================================================

``optim.recipe = "auto"`` (``recipe.py``) picks lr, eta and warm-up from the global batch, the
optimiser and whether the model normalises. Each optimiser is one file that registers its factory
(its own options are the factory's annotated keywords: ``[optim.lars]``, ``[optim.lamb]`` in the
config), its recipe row and, where it has its own, its lr and warm-up when those are unset:
``sgd.py``, ``lars.py``, ``lamb.py``; importing them here, in that order, makes them built-ins.
"""
from __future__ import annotations

import inspect

import torch

# the built-in optimisers, registered in this order: the order errors and --help list them in
# isort: off
from .sgd import split_1d
from .lars import LARS, resolve_norms_fn, trust_ratio
from .lamb import LAMB
# isort: on
from .loss_scale import LossScaler, grads_have_inf, next_scale, unscale_and_check_
from .registry import OPTIMIZERS
from .schedules import (
    ScheduleSpec,
    linear_scaled_lr,
    lr_at,
    mlperf_lars_base_lr,
    mlperf_lars_warmup_epochs,
    spec_from_config,
)

__all__ = ["LARS", "LAMB", "trust_ratio", "resolve_norms_fn", "LossScaler", "next_scale",
           "grads_have_inf", "unscale_and_check_", "ScheduleSpec", "lr_at",
           "linear_scaled_lr", "mlperf_lars_base_lr", "mlperf_lars_warmup_epochs",
           "spec_from_config", "make_optimizer", "make_criterion", "set_lr", "split_1d",
           "OPTIMIZERS"]


def _params(params_or_model) -> list[torch.nn.Parameter]:
    if isinstance(params_or_model, torch.nn.Module):
        params_or_model = params_or_model.parameters()
    return [p for p in params_or_model if p.requires_grad]


def _check_keywords(factory, name: str, own_options: dict) -> None:
    """A keyword ``factory`` does not name (its ``**_`` only absorbs the shared options it does not
    use) is a TypeError naming it: another optimiser's option (``eta`` for sgd) or an old name
    (``adam_eps``) would otherwise be dropped without a word."""
    named = [p.name for p in list(inspect.signature(factory).parameters.values())[1:]
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    unknown = [k for k in own_options if k not in named]
    if unknown:
        shared = inspect.signature(make_optimizer).parameters         # flat in [optim]
        own = [k for k in named if k not in shared] or ["none"]
        raise TypeError(f"make_optimizer: optimiser {name!r} takes no keyword {unknown[0]!r} "
                        f"(its own: {', '.join(own)})")


def make_optimizer(params_or_model, name: str, lr: float, momentum: float = 0.9,
                   weight_decay: float = 0.0, nesterov: bool = False, *,
                   exclude_1d: bool = True, lr_1d_scale: float = 1.0, **own_options) -> torch.optim.Optimizer:
    """Build the optimiser registered as ``name`` (``sgd``: ``torch.optim.SGD``, ``lars``,
    ``lamb``; :data:`OPTIMIZERS`) for a model (or an iterable of parameters).

    SGD with ``exclude_1d``: two param groups, the 1-D one with ``weight_decay=0`` (Goyal et
    al.). LARS and LAMB handle the 1-D exclusion themselves (trust ratio and weight decay; lr
    times ``lr_1d_scale``); LAMB's beta1 is ``momentum``. The schedule sets ``lr`` every step
    through ``set_lr``. ``own_options``: the optimiser's own (its factory's annotated keywords, the
    ``[optim.<name>]`` table: LARS ``eta``, ``eps``, ``clip``; LAMB ``beta2``, ``eps``), each
    defaulting to the factory's, as a config-built optimiser's does; one it does not take is a
    TypeError naming it (as ``optim.sgd.eta`` is an unknown key in the config).
    """
    factory = OPTIMIZERS.get(name)
    _check_keywords(factory, name, own_options)
    return factory(_params(params_or_model), lr=lr, momentum=momentum, weight_decay=weight_decay,
                   nesterov=nesterov, exclude_1d=exclude_1d, lr_1d_scale=lr_1d_scale, **own_options)


def make_criterion(label_smoothing: float = 0.0) -> torch.nn.CrossEntropyLoss:
    """Cross-entropy with label smoothing ``eps``: (1-eps)*NLL(y) + eps*mean_k(-log p_k)."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    return torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every param group (call with ``lr_at(step, spec)``)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
