"""An update algorithm in one file: synchronous SGD with the mean gradient clipped to a global
L2 norm (``update.algorithm``).

Select it without editing the package:
``--set update.algorithm=examples.plugins.clipped_ssgd:clipped_ssgd``. Its constructor is its option
schema: ``max_norm``, annotated with its help and range, is the config key
``update.clipped_ssgd.max_norm`` (``[update.clipped_ssgd]`` in a TOML file, listed by ``--help`` once
the plugin is imported) with no edit elsewhere; :func:`~hpctrain.config.plugins.check_options`
checks a value given in code by the same rule.

Clipping acts on the agreed mean, which every rank holds bit for bit, so every rank scales by the
same factor and the replicas stay identical. Under a loss scaler the mean is still scaled when
:meth:`apply_mean` starts, so the bound is scaled with it; an overflowed step is skipped as SSGD
skips it, untouched.
"""
from __future__ import annotations

from typing import Annotated

import torch

from hpctrain.config.plugins import check_options
from hpctrain.config.values import POSITIVE, Option
from hpctrain.update.base import ALGORITHMS
from hpctrain.update.ssgd import SSGD


@ALGORITHMS.register("clipped_ssgd")
class ClippedSSGD(SSGD):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_sync, *,
                 max_norm: Annotated[float, Option("clip the mean gradient to this global L2 norm", POSITIVE)] = 1.0,
                 **kwargs):
        check_options(ClippedSSGD, "update.clipped_ssgd", locals())
        super().__init__(model, optimizer, grad_sync, **kwargs)
        self.max_norm = float(max_norm)

    def apply_mean(self, step, overflow, scale, loss, own_grads_finite, **options) -> bool:
        if not overflow:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_norm * scale)
        return super().apply_mean(step, overflow, scale, loss, own_grads_finite, **options)
