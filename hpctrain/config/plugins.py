"""Plugin options in sub-tables: ``[update.odsgd]`` in TOML, ``--set update.odsgd.warmup_steps=50``.

A section whose plugins take options has a field made by :func:`plugin_tables`, holding the
registry of those plugins (``hpctrain.update.ALGORITHMS``, given by the schema,
:mod:`hpctrain.job.config`); it holds ``{plugin: {option: value}}`` as given. A plugin's options
are the keywords of its constructor annotated ``Annotated[type, Option(help, range)]``
(:class:`~hpctrain.config.values.Option`): the type, default, help and range of each are written
there once and read from there by the config (coercion, :func:`hpctrain.job.config.validate`,
``--help``), by :func:`plugin_options` (the keywords the plugin is built with) and by the plugin's
own check of values given in code (:func:`check_options`). So a new option is one annotated
keyword. This module knows no section and imports no registry.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpctrain.config.values import Option, coerce, field_problem
from hpctrain.errors import ConfigError


@dataclass(frozen=True)
class OptionSpec:
    """One plugin option: its keyword, base type, default and :class:`Option` (help, range)."""
    name: str
    type: type
    default: object
    option: Option


def plugin_tables(registry: Mapping, help: str) -> Any:
    """The field holding the option sub-tables of the plugins in ``registry``."""
    return field(default_factory=dict, metadata={"help": help, "plugins": registry})


@functools.cache
def option_schema(factory) -> dict[str, OptionSpec]:
    """The options of ``factory`` (a class or a function): its keywords annotated with an Option."""
    hints = _hints(factory.__init__ if inspect.isclass(factory) else factory)
    specs = {}
    for p in inspect.signature(factory).parameters.values():
        hint = hints.get(p.name)
        if typing.get_origin(hint) is typing.Annotated:
            base, *extras = typing.get_args(hint)
            option = next((x for x in extras if isinstance(x, Option)), None)
            if option is not None:
                specs[p.name] = OptionSpec(p.name, base, p.default, option)
    return specs


def _hints(target) -> dict:
    """``target``'s annotations, resolved; where one names what only a type checker imports
    (``if TYPE_CHECKING:``), the others, each on its own."""
    try:
        return typing.get_type_hints(target, include_extras=True)
    except NameError:
        hints = {}
        for name, ann in getattr(target, "__annotations__", {}).items():
            try:
                hints[name] = eval(ann, getattr(target, "__globals__", {})) if isinstance(ann, str) else ann
            except Exception:
                continue
        return hints


def tables_field(sec) -> dataclasses.Field | None:
    """The :func:`plugin_tables` field of section ``sec``, or None."""
    return next((f for f in dataclasses.fields(sec) if "plugins" in f.metadata), None)


def _registry(f: dataclasses.Field):
    return f.metadata["plugins"]


def _factory(sec, f: dataclasses.Field, plugin: str):
    """The plugin registered as ``plugin``; one chosen as ``module:plugin`` in the section (its
    choice field) is imported first. None where there is none."""
    reg = _registry(f)
    if plugin not in reg:
        for g in dataclasses.fields(sec):
            chosen = getattr(sec, g.name)
            if g.metadata.get("choices") is f.metadata["plugins"] and isinstance(chosen, str) and ":" in chosen:
                reg.plugin_problem(chosen)              # imports the module, which registers it
    return reg[plugin] if plugin in reg else None


def option_problem(sec, section: str, plugin: str, name: str, value=None, *,
                   check_value: bool = True) -> tuple[OptionSpec | None, str | None]:
    """``(spec, problem)`` of ``section.plugin.name``: the option's spec (None where there is no
    such plugin or option) and what is wrong (an unknown key, or the value's range), or None."""
    f = tables_field(sec)
    if f is None:
        return None, "unknown key"
    if ":" in plugin:               # the sub-table is the registered name, as plugin_options reads it
        return None, f"unknown key (name the sub-table by the plugin's registered name, {plugin.partition(':')[2]})"
    factory = _factory(sec, f, plugin)
    if factory is None:
        with_options = [n for n, x in _registry(f).items() if option_schema(x)]
        return None, f"unknown key (sub-tables of [{section}]: {', '.join(with_options)})"
    schema = option_schema(factory)
    if name not in schema:
        return None, f"unknown key ({plugin}'s options: {', '.join(schema) or 'none'})"
    return schema[name], field_problem(schema[name].option, value, name) if check_value else None


def set_option(sec, section: str, key: str, value, given: str) -> None:
    """``section.key`` = value where ``key`` is ``plugin.option``: coerced to the option's type and
    stored in the section's sub-table of ``plugin``; a ConfigError names ``given`` (the key as the
    user wrote it)."""
    plugin, _, name = key.partition(".")
    spec, problem = option_problem(sec, section, plugin, name, check_value=False)
    if spec is None:
        raise ConfigError(f"config {given}: {problem}")
    f = tables_field(sec)
    assert f is not None                    # option_problem found a spec in its registry
    getattr(sec, f.name).setdefault(plugin, {})[name] = coerce(given, value, spec.type)


def table_problems(sec, section: str) -> Iterator[tuple[str, str]]:
    """Yield ``(key, problem)`` for each sub-table option of ``sec`` that is unknown or out of range."""
    f = tables_field(sec)
    for plugin, table in (getattr(sec, f.name).items() if f else ()):
        for name, value in table.items():
            _, problem = option_problem(sec, section, plugin, name, value)
            if problem:
                yield f"{section}.{plugin}.{name}", problem


def plugin_options(sec, chosen: str) -> dict:
    """The keyword options to build plugin ``chosen`` with: its schema's defaults overlaid with
    its sub-table in section ``sec``."""
    f = tables_field(sec)
    assert f is not None, f"section {type(sec).__name__} has no plugin sub-tables"
    factory = _registry(f).get(chosen)
    given = getattr(sec, f.name).get(factory.name, {})
    return {k: given.get(k, spec.default) for k, spec in option_schema(factory).items()}


def recorded_tables(sec) -> dict:
    """Section ``sec``'s sub-tables for the run record: the chosen plugin's with every option it is
    built with (defaults too, so the record says what ran: an ``optim.lars.eta`` left at its
    default is still written), the others as given. A choice that does not resolve (the config's
    validation names it) keeps its table as given."""
    f = tables_field(sec)
    if f is None:
        return {}
    tables = {k: dict(v) for k, v in getattr(sec, f.name).items()}
    chosen = next((getattr(sec, g.name) for g in dataclasses.fields(sec)
                   if g.metadata.get("choices") is f.metadata["plugins"]), None)
    try:
        factory = _factory(sec, f, chosen.rpartition(":")[2]) if isinstance(chosen, str) else None
    except ImportError:
        factory = None
    if factory is not None and option_schema(factory):
        tables[factory.name] = plugin_options(sec, factory.name)
    return tables


def check_options(factory, prefix: str, values: Mapping) -> None:
    """Check the option values given in code (the library API) against ``factory``'s schema, as
    :func:`hpctrain.job.config.validate` checks the config; a ConfigError names ``prefix.key``.
    ``values``: the constructor's ``locals()`` will do (keys outside the schema are ignored),
    so a new option needs no line here."""
    for key, spec in option_schema(factory).items():
        problem = field_problem(spec.option, values[key], key) if key in values else None
        if problem:
            raise ConfigError(f"config {prefix}.{key}: {problem}")


def help_lines(sec, section: str) -> list[str]:
    """``--help`` lines of every registered plugin's options in section ``sec``."""
    f = tables_field(sec)
    lines = []
    for plugin, factory in (_registry(f).items() if f else ()):
        for name, spec in option_schema(factory).items():
            rng = spec.option.range
            extra = f" (must be {rng.describe()})" if rng is not None else ""
            lines.append(f"  {section}.{plugin}.{name} = {spec.default!r}\n      {spec.option.help}{extra}")
    return lines
