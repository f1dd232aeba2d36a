"""The values a config key accepts: ranges, coercion of TOML and ``--set`` strings, and the
check of one value against its range or choices.

Shared by the sections' fields (the schema, :mod:`hpctrain.job.config`) and the plugin options
read from a plugin's constructor (:mod:`hpctrain.config.plugins`), so each rule is written once;
with :func:`is_plugin_spec` (is a value ``package.module:name``). Imports neither
torch nor MPI, nor any registry: a choice field is given its registry (or a tuple) by the schema.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpctrain.errors import ConfigError

INF = math.inf

@dataclass(frozen=True)
class Range:
    """The values a numeric field accepts: ``lo``..``hi``, each end closed unless marked open."""
    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, x) -> bool:
        above = x > self.lo if self.lo_open else x >= self.lo
        below = x < self.hi if self.hi_open else x <= self.hi
        return above and below

    def describe(self) -> str:
        """``positive``, ``>= 0`` or ``in [lo, hi)`` (what follows "must be" in an error)."""
        if self.hi == INF and self.lo == 0:
            return "positive" if self.lo_open else ">= 0"
        if self.hi == INF:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


POSITIVE, NON_NEGATIVE, FRACTION = Range(0, INF, lo_open=True), Range(0, INF), Range(0, 1, hi_open=True)
LR = Range(0, 1e3, lo_open=True)
# = LossScaler's default min_scale / max_scale (tests/unit/test_config.py checks they agree): a
# scale of at most 2**24 keeps loss * scale and the scaled gradients finite in fp32, and fp16
# overflows back off from there.
LOSS_SCALE = Range(1.0, 2.0 ** 24)


def opt(default, help: str, *, range: Range | None = None, choices=None, **kw) -> Any:
    """A dataclass field with a help text for ``--help``; numeric fields give their ``range``,
    choice fields their ``choices`` (a tuple, or the :class:`~hpctrain.config.registries.Registry` to check)."""
    meta = {"help": help, "range": range, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass(frozen=True)
class Option:
    """A plugin's option, as ``Annotated[int, Option("help", NON_NEGATIVE)]`` on a keyword of its
    constructor: the help and the range (or choices) a config field's :func:`opt` carries, so the
    constructor is the option's one schema (:mod:`hpctrain.config.plugins`)."""
    help: str
    range: Range | None = None
    choices: object = None

    @property
    def metadata(self) -> Mapping:
        return {"help": self.help, "range": self.range, "choices": self.choices}



def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise ValueError
    return x


def _number(v):
    """A list element: an int or a finite float (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError
    return v if isinstance(v, int) else _finite(v)


def coerce(key: str, value, target_type) -> Any:
    """Convert a TOML or string value to the field's type, or raise ConfigError naming the key.

    Floats must be finite: NaN and ±inf (``inf``, ``nan``, ``1e400``) are refused here, for every
    float field, before any range check.
    """
    tname = target_type if isinstance(target_type, str) else getattr(target_type, "__name__", str(target_type))
    tname = tname.split("[")[0]
    given = value
    try:
        if tname == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if tname == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if tname == "float":
            if isinstance(value, bool):
                raise ValueError
            return _finite(float(value))
        if tname == "list":
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip()]
                value = [float(v) if "." in v else int(v) for v in value]
            return [_number(v) for v in value]
        if tname == "str":
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError, OverflowError):
        want = {"float": "a finite float", "list": "a list of finite numbers"}.get(tname, tname)
        raise ConfigError(f"config {key}: expected {want}, got {given!r}") from None
    return value


_PLUGIN_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def is_plugin_spec(value: str) -> bool:
    """Is ``value`` a ``package.module:name`` plugin reference (and not an existing directory)?"""
    return bool(_PLUGIN_SPEC.fullmatch(value)) and not os.path.isdir(value)


def registry(choices) -> tuple:
    """The accepted names of a choice field: a tuple's items, or a registry's (a mapping's) keys."""
    return tuple(choices)


def _plugin_problem(choices, value: str) -> str | None:
    """``package.module:name`` for a registry field (:mod:`hpctrain.config.registries`): None once the
    module imports and registers ``name``, else why not."""
    if not hasattr(choices, "plugin_problem"):
        return f"must be one of {' | '.join(registry(choices))}, got {value!r}"
    return choices.plugin_problem(value)


def field_problem(f: dataclasses.Field | Option, value, name: str = "") -> str | None:
    """What is wrong with ``value`` for field (or plugin option) ``f``: its range or choices, or
    None. ``name``: the key's last part (a field's own name where not given).

    A range refuses NaN and ±inf by itself (every comparison with NaN is false; every float range
    has finite ends), so a non-finite value set in code, past ``coerce``, is caught here too.
    """
    rng, choices = f.metadata.get("range"), f.metadata.get("choices")
    if (name or getattr(f, "name", "")) == "loss_scale":                 # precision.loss_scale: a word or a number
        if value in ("none", "dynamic"):
            return None
        assert rng is not None      # its field has range=LOSS_SCALE
        try:
            ok = float(value) in rng
        except ValueError:
            ok = False
        return None if ok else f"must be none, dynamic or a number {rng.describe()}, got {value!r}"
    if choices is not None:
        allowed = registry(choices)
        if isinstance(value, str) and ":" in value:
            return _plugin_problem(choices, value)
        return None if value in allowed else f"must be one of {' | '.join(allowed)}, got {value!r}"
    if rng is None:
        return None
    for x in value if isinstance(value, list) else [value]:
        if x not in rng:
            return f"must be {rng.describe()}, got {x!r}"
    return None

