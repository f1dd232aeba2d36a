"""An optimiser in one file: torch's AdamW as ``optim.name``
(``--set optim.name=examples.plugins.adamw_optimizer:adamw``).

The factory's signature is its option schema: it takes the ``[optim]`` options it uses (beta1 is
``optim.momentum``, beta2 ``optim.lamb_beta2``, epsilon ``optim.lamb_eps``, as for LAMB) and ignores
the rest (``**_``). Decoupled weight decay applies to every parameter, 1-D ones included, as
torch's AdamW does; the learning-rate schedule sets ``lr`` each step as for any optimiser.
"""
from __future__ import annotations

import torch

from hpctrain.optim.registry import OPTIMIZERS


@OPTIMIZERS.register("adamw")
def adamw(params, *, lr: float, momentum: float, weight_decay: float, beta2: float, adam_eps: float,
          **_) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=(momentum, beta2), eps=adam_eps, weight_decay=weight_decay)
