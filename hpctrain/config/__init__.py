"""The bottom layer of the configuration: what a config value may be, with no knowledge of the run's
sections.

:mod:`~hpctrain.config.values`: ranges (:class:`Range`), coercion of TOML and ``--set`` strings, the
check of one value against its range or choices, and :class:`Option`, a plugin option's help and
range. :mod:`~hpctrain.config.plugins`: a plugin's options read from its constructor's signature
(``[update.odsgd]``, ``[comm.NAME]``, ``[optim.lars]`` sub-tables) and checked when a plugin is
built in code. :mod:`~hpctrain.config.registries`: :class:`Registry`, the one plugin seam
(strategies, codecs, algorithms, optimisers, data sources). Plugins (``comm``, ``update``,
``optim``) import these; the schema that names every section and registry is assembled on top of
them, next to the job that runs it (:mod:`hpctrain.job.config`), so imports run one way.
"""
from hpctrain.config.values import (
    FRACTION,
    INF,
    LOSS_SCALE,
    LR,
    NON_NEGATIVE,
    POSITIVE,
    Option,
    Range,
    coerce,
    field_problem,
    is_plugin_spec,
    opt,
    registry,
)
from hpctrain.errors import ConfigError

__all__ = ["ConfigError", "Range", "Option", "INF", "POSITIVE", "NON_NEGATIVE", "FRACTION", "LR", "LOSS_SCALE",
           "opt", "coerce", "registry", "field_problem", "is_plugin_spec"]
