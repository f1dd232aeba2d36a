"""An update algorithm in one file: synchronous SGD with the mean gradient clipped to a global
L2 norm (``sync.algorithm``).

Select it without editing the package:
``--set sync.algorithm=examples.plugins.clipped_ssgd:clipped_ssgd``. Its constructor is its option
schema: ``max_norm`` would be read from a ``sync.clipped_ssgd_max_norm`` field if
:class:`~hpctrain.config.SyncConfig` had one (:func:`hpctrain.update.algorithm_options`); without
it the default below applies.

Clipping acts on the agreed mean, which every rank holds bit for bit, so every rank scales by the
same factor and the replicas stay identical. Under a loss scaler the mean is still scaled when
:meth:`apply_mean` starts, so the bound is scaled with it; an overflowed step is skipped as SSGD
skips it, untouched.
"""
from __future__ import annotations

import torch

from hpctrain.errors import ConfigError
from hpctrain.update.base import ALGORITHMS
from hpctrain.update.ssgd import SSGD


@ALGORITHMS.register("clipped_ssgd")
class ClippedSSGD(SSGD):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_sync, *,
                 max_norm: float = 1.0, **kwargs):
        if not max_norm > 0:
            raise ConfigError(f"sync.clipped_ssgd_max_norm: must be positive, got {max_norm!r}")
        super().__init__(model, optimizer, grad_sync, **kwargs)
        self.max_norm = float(max_norm)

    def apply_mean(self, step, overflow, scale, loss, own_grads_finite, lrs=None) -> bool:
        if not overflow:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_norm * scale)
        return super().apply_mean(step, overflow, scale, loss, own_grads_finite, lrs)
