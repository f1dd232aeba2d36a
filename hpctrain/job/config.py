"""The run's configuration read and checked: ``--help``'s key list, an optional TOML file, ``--set
key=value`` overrides, and :func:`validate`: every check that needs neither the device nor the data,
before anything starts (those that do are set-up's, :mod:`hpctrain.job.setup`).

The sections themselves are :mod:`hpctrain.job.schema`'s (re-exported here).

Precedence: dataclass defaults < TOML file (``--config``) < ``--set section.key=value`` < named
flags (``--epochs``…). Every field carries a one-line help text (``help_text``); ``--help`` lists
them all. Bad values raise :class:`ConfigError` whose message names the field — the entry point
prints it as one line on rank 0 and every rank exits with status 2.

Numbers: every int and float field carries a :class:`Range` (shown by ``--help``); NaN and ±inf
are refused for every float field when the value is read (``coerce``), the range by
:func:`validate` (both in :mod:`hpctrain.config.values`). Choice fields hold their registry
(``choices=STRATEGIES``), which :func:`validate` and ``--help`` read, so a strategy, compression,
schedule… added there is accepted and listed here without re-typing the list. A value
``package.module:name`` selects a plugin outside the tree (:mod:`hpctrain.config.registries`). A plugin's
own options live in a sub-table (``[update.odsgd]``) whose schema is the plugin's constructor
(:mod:`hpctrain.config.plugins`).

The top of the house: this module imports every registry directly (hence torch and MPI), and
nothing below the job imports it. :mod:`hpctrain.config` is the layer under it that the plugins
share (values, ranges, a constructor's options); the job resolves a Config into plain keywords
once (:mod:`hpctrain.job.setup`) and the library takes those.

Keys that were renamed are listed once in docs/changelog.md; an old key is an unknown key.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
import typing

from hpctrain.config.plugins import help_lines, set_option, table_problems
from hpctrain.config.values import coerce, field_problem, registry
from hpctrain.data.plan import lane_problem
from hpctrain.errors import ConfigError
from hpctrain.job.schema import (
    CheckpointConfig,
    CommConfig,
    Config,
    DataConfig,
    ModelConfig,
    OptimConfig,
    PolishConfig,
    PrecisionConfig,
    ReportConfig,
    RunConfig,
    TrainConfig,
    UpdateConfig,
    sections,
)
from hpctrain.models.ghostbn import group_problem
from hpctrain.ops.tensorboard import tensorboard_missing
from hpctrain.optim.recipe import row_problem

__all__ = ["Config", "ConfigError", "sections", "help_text", "set_value", "load_toml", "validate",
           "DataConfig", "ModelConfig", "TrainConfig", "OptimConfig", "CommConfig", "UpdateConfig", "PrecisionConfig",
           "PolishConfig", "CheckpointConfig", "RunConfig", "ReportConfig"]


def _help(f: dataclasses.Field) -> str:
    """A field's help; ``{choices}`` in it becomes its registry's names, read now (``--help``)."""
    text = f.metadata.get("help", "")
    return text.replace("{choices}", " | ".join(registry(f.metadata["choices"]))) if "{choices}" in text else text


def help_text(cfg: Config | None = None) -> str:
    """All keys with type, default, help and range, for ``--help``: each plugin's options too
    (imports the registries, hence torch: call it when the help is printed)."""
    cfg = cfg or Config()
    lines = []
    for name, sec in sections(cfg):
        for f in dataclasses.fields(sec):
            if "plugins" in f.metadata:
                lines += help_lines(sec, name)
                continue
            default = getattr(sec, f.name)
            rng = f.metadata.get("range")
            extra = f" (must be {rng.describe()})" if rng is not None else ""
            lines.append(f"  {name}.{f.name} = {default!r}\n      {_help(f)}{extra}")
    return "\n".join(lines)


def set_value(cfg: Config, dotted: str, value) -> None:
    """Set ``section.key`` (or ``section.plugin.option``) on cfg from a TOML value or a CLI string.
    Errors name the key as given."""
    given = dotted
    section, _, key = dotted.partition(".")
    sec = getattr(cfg, section, None) if section in {n for n, _ in sections(cfg)} else None
    if sec is None or not key:
        raise ConfigError(f"config {given}: unknown key (sections: {', '.join(n for n, _ in sections(cfg))})")
    if "." in key:
        set_option(sec, section, key, value, given)
        return
    hints = typing.get_type_hints(type(sec))
    if key not in hints or key in {f.name for f in dataclasses.fields(sec) if "plugins" in f.metadata}:
        raise ConfigError(f"config {given}: unknown key")
    setattr(sec, key, coerce(given, value, hints[key]))


def load_toml(cfg: Config, path: str) -> None:
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except OSError as exc:                        # a directory, no permission, an I/O error
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:             # TOML is UTF-8 by definition
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} "
                          f"at offset {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    for section, table in doc.items():
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: top-level key {section!r} must be a [section]")
        for key, value in table.items():
            if isinstance(value, dict):           # a plugin's sub-table, [update.odsgd]
                for option, v in value.items():
                    set_value(cfg, f"{section}.{key}.{option}", v)
            else:
                set_value(cfg, f"{section}.{key}", value)


def dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be used (or created) as a directory, or None."""
    p = os.path.abspath(path)
    probe = p
    while not os.path.lexists(probe):         # the nearest existing ancestor decides
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    if os.path.isdir(probe):
        return None
    if probe == p:
        return f"{path} exists and is not a directory"
    return f"{path}: {probe} is not a directory"


THREADS_PER_CORE = 4     # train.threads: at most this many per core of the node (more only thrash)


def threads_problem(threads: int) -> str | None:
    """Why ``train.threads`` is more than a rank can use (a few per core of this node), or None."""
    cores = os.cpu_count() or 1
    if threads > THREADS_PER_CORE * cores:
        return f"{threads} threads per rank is more than {THREADS_PER_CORE} per core of this node ({cores} cores)"
    return None


def validate(cfg: Config, world_size: int = 1) -> None:
    """Check values that would otherwise fail later, on some ranks, with a traceback (or train on
    NaN): every field's range or choices, then what depends on several fields or the file system."""
    for name, sec in sections(cfg):
        for f in dataclasses.fields(sec):
            problem = field_problem(f, getattr(sec, f.name))
            if problem:
                key = f"{name}.{f.name}"
                raise ConfigError(f"config {key}: {problem}")
        for key, problem in table_problems(sec, name):
            raise ConfigError(f"config {key}: {problem}")
    checks = [   # each computed once, in this order; the first problem stops
        ("train.batch_size", lambda: None if cfg.train.batch_size % world_size == 0 else
         f"global batch {cfg.train.batch_size} is not divisible by {world_size} ranks"),
        ("data.lanes", lambda: lane_problem(cfg.data.lanes, world_size, cfg.train.batch_size)
         if cfg.data.lanes else None),
        ("model.bn_group", lambda: group_problem(cfg.model.bn_group, cfg.train.batch_size, world_size)),
        ("train.threads", lambda: threads_problem(cfg.train.threads)),
        ("run.run_dir", lambda: dir_problem(cfg.run.run_dir)),
        ("ckpt.dir", lambda: cfg.ckpt.dir and dir_problem(cfg.ckpt.dir)),
        ("optim.recipe", lambda: row_problem(cfg.optim.name) if cfg.optim.recipe == "auto" else None),
        ("report.tensorboard", lambda: tensorboard_missing() if cfg.report.tensorboard else None),
        ("data.dataset", lambda: _dataset_problem(cfg.data.dataset)),
    ]
    for key, problem_of in checks:
        problem = problem_of()
        if problem:
            raise ConfigError(f"config {key}: {problem}")


def _dataset_problem(dataset: str) -> str | None:
    """Why a ``package.module:name`` dataset selects no data source (imported here, when checked:
    the schema never imports the data tools)."""
    from hpctrain.data_tools.builtin import dataset_problem
    return dataset_problem(dataset)
