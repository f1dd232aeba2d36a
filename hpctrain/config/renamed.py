"""Renamed config keys: old spellings keep working, each with one deprecation line.

:data:`RENAMED` maps an old key to its new one. ``set_value`` (TOML, ``--set``) reads an old key as
its new one and notes it in ``cfg.renamed``; the entry point prints :func:`deprecation_lines` on
rank 0. In Python, :func:`install_old_names` makes each old name within its own section a
property that reads and sets the new key with a DeprecationWarning, and a constructor keyword of
the section; an old name that moved to another section (``sync.comm_delay_ms``) is a one-line
AttributeError saying where. None of them is a field, so ``==``, ``asdict`` and ``to_dict`` see
the new keys only.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from hpctrain.config.plugins import plugin_options, tables_field

if TYPE_CHECKING:
    from hpctrain.config import Config

# Old key -> new key: read as the new one, with one deprecation line each (users' files keep working).
RENAMED = {
    "sync.comm_delay_ms": "comm.delay_ms",                  # it configures the comm layer
    "optim.lars_exclude_1d": "optim.exclude_1d",            # it governs SGD's weight decay too
    **{f"sync.odsgd_{k}": f"sync.odsgd.{k}" for k in ("warmup_steps", "local_lr", "local_momentum", "dc_lambda")},
    **{f"optim.{p}_{k}": f"optim.{p}.{k}" for p, k in (("lars", "eta"), ("lars", "eps"), ("lars", "clip"),
                                                        ("lamb", "beta2"), ("lamb", "eps"))},
}


def _old_name(old: str, new: str) -> property:
    """``sec.<old>`` in Python: reads and sets ``new`` (a field or ``plugin.option``, read as the
    plugin will be built) in the same section, with a DeprecationWarning."""
    key = new.partition(".")[2]
    plugin, _, option = key.rpartition(".")

    def warn(stacklevel: int) -> None:
        warnings.warn(f"config {old} is deprecated: use {new}", DeprecationWarning, stacklevel=stacklevel)

    def read(sec):
        warn(3)
        return plugin_options(sec, plugin)[option] if plugin else getattr(sec, key)

    def write(sec, value, stacklevel: int = 3) -> None:
        warn(stacklevel)
        if plugin:
            f = tables_field(sec)
            assert f is not None
            getattr(sec, f.name).setdefault(plugin, {})[option] = value
        else:
            setattr(sec, key, value)
    return property(read, write, doc=f"Deprecated: {new}.")


def _moved(old: str, new: str) -> property:
    """``sec.<old>`` where ``new`` is in another section: a one-line AttributeError saying where."""
    def fail(sec, *value):
        raise AttributeError(f"config {old} moved to another section: use cfg.{new}")
    return property(fail, fail, doc=f"Moved: cfg.{new}.")


def _old_keywords(cls, names: set[str]) -> None:
    """Let ``cls(old=value)`` work for its old names, through their properties' setters: warned
    (at the caller's line) and stored under the new key, or refused in one line naming the
    section the key moved to."""
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        old = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        init(self, *args, **kwargs)
        for k, v in old.items():
            vars(cls)[k].fset(self, v, 4)       # warn -> setter -> this __init__ -> the caller
    __init__.__doc__, __init__.__wrapped__ = init.__doc__, init          # type: ignore[attr-defined]
    cls.__init__ = __init__


def install_old_names(section_types: dict) -> None:
    """Give each section class (``{section name: class}``) its old names (module docstring)."""
    for old, new in RENAMED.items():
        sec, _, name = old.partition(".")
        same = sec == new.partition(".")[0]
        setattr(section_types[sec], name, (_old_name if same else _moved)(old, new))
    for sec in {k.partition(".")[0] for k in RENAMED}:
        _old_keywords(section_types[sec], {k.partition(".")[2] for k in RENAMED if k.startswith(sec + ".")})


def deprecation_lines(cfg: Config) -> list[str]:
    """One line per old key this config was given (the entry point prints them on rank 0)."""
    return [f"hpctrain: warning: config {old} is deprecated: use {new} (read as {new} this time)"
            for new, old in cfg.renamed.items()]
