"""``optim.name``: the optimiser factories by name (a leaf module, so an optimiser's own file can
register itself without importing :mod:`hpctrain.optim`). Its recipe row and its unset lr and
warm-up have their own tables, :data:`~hpctrain.optim.recipe.RECIPE_ROWS` and
:data:`~hpctrain.optim.schedules.UNSET`, filled from the same file under the same name.

A factory is called as ``factory(params, **options)`` with the options all optimisers share
(``lr``, ``momentum``, ``weight_decay``, ``nesterov``, ``exclude_1d``, ``lr_1d_scale``: flat in
``[optim]``) and its own: its keywords annotated ``Annotated[type, Option(help, range)]``, the
sub-table ``[optim.<name>]`` (:mod:`hpctrain.config.plugins`). Its signature names the ones it
uses and ends in ``**_`` for the rest.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hpctrain.config.registries import Registry

if TYPE_CHECKING:
    import torch

# Registration order (sgd.py, lars.py, lamb.py, imported so by hpctrain/optim/__init__.py) is the order
# errors and --help list them in.
OPTIMIZERS: Registry[Callable[..., torch.optim.Optimizer]] = Registry("optim.name", "optimiser", sort_choices=False)


def registered_name(optimizer: str) -> str:
    """The name ``optimizer`` is registered under (``package.module:adamw`` -> ``adamw``, the module
    imported): its sub-table ``[optim.<name>]``, recipe row and unset values are filed under it.
    An unknown optimiser is a ValueError naming the choices."""
    OPTIMIZERS.get(optimizer)
    return optimizer.partition(":")[2] if ":" in optimizer else optimizer
