"""An optimiser in one file: torch's AdamW as ``optim.name``
(``--set optim.name=examples.plugins.adamw_optimizer:adamw``).

The factory's signature is its option schema: it takes the shared ``[optim]`` options it uses
(beta1 is ``optim.momentum``, as for LAMB) and ignores the rest (``**_``); its own options,
annotated with their help and range, are the config keys ``optim.adamw.beta2`` and
``optim.adamw.eps`` (``[optim.adamw]`` in a TOML file, listed by ``--help`` once the plugin is
imported) with no edit elsewhere. Decoupled weight decay applies to every parameter, 1-D ones
included, as torch's AdamW does; the learning-rate schedule sets ``lr`` each step as for any
optimiser. It registers no row of the large-batch recipe, so ``optim.recipe = "auto"`` refuses
it in one line; ``RECIPE_ROWS["adamw"] = row`` here (``hpctrain.optim.recipe``) would give it one.
"""
from __future__ import annotations

from typing import Annotated

import torch

from hpctrain.config.values import FRACTION, Option, Range
from hpctrain.optim.registry import OPTIMIZERS


@OPTIMIZERS.register("adamw")
def adamw(params, *, lr: float, momentum: float, weight_decay: float,
          beta2: Annotated[float, Option("second-moment decay (beta1 is optim.momentum)", FRACTION)] = 0.999,
          eps: Annotated[float, Option("epsilon added to sqrt(v_hat)", Range(0, 1))] = 1e-6,
          **_) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=(momentum, beta2), eps=eps, weight_decay=weight_decay)
