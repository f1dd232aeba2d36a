"""The table of gradient synchronisation strategies (``comm.strategy``).

A module of its own, importing nothing of the package, so each strategy registers itself where
it is defined (``@STRATEGIES.register("flat")`` on :class:`~hpctrain.comm.flat.FlatSync`, as
codecs and algorithms do) without an import cycle through :mod:`hpctrain.comm`, which imports
every built-in strategy and then registers the ``auto`` selector. ``hpctrain.comm.STRATEGIES``
is this object.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hpctrain.config.registries import Registry

if TYPE_CHECKING:
    from hpctrain.comm.base import GradSync

# A strategy class, or a selector such as ``auto``, called as ``(params, topology, **kwargs)``.
# Registration order (flat, hierarchical, then auto) is the order config errors list the choices in.
STRATEGIES: Registry[Callable[..., GradSync]] = Registry("comm.strategy", "strategy")

