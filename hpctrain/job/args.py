"""The training job's command line: the flags, ``--set`` and ``--config`` parsed into a
:class:`~hpctrain.job.config.Config` (:func:`config_from_args`), and the early look at the few keys
read before MPI and torch start (:func:`early_look`)."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hpctrain.cli import SUBCOMMANDS

if TYPE_CHECKING:
    from hpctrain.job.config import Config

# Named flags: shortcuts for the most used ``--set`` keys.
FLAGS = {
    "--run-dir": "run.run_dir", "--epochs": "train.epochs", "--batch-size": "train.batch_size",
    "--lr": "optim.lr", "--optimizer": "optim.name", "--seed": "train.seed", "--max-steps": "train.max_steps",
    "--model": "model.name", "--data": "data.dataset", "--strategy": "comm.strategy",
    "--compression": "comm.compression", "--ranks-per-node": "comm.ranks_per_node",
    "--resume": "ckpt.resume",
}


class _KeysParser(argparse.ArgumentParser):
    """Lists the config keys after the options: read from the registries (plugins' choices and
    options; torch is imported) only when the help is printed, not on every parse."""

    def format_help(self) -> str:
        from hpctrain.job.config import help_text
        self.epilog = ("configuration keys (TOML [section] key = value, [section.plugin] for a plugin's options, "
                       "or --set section.key=value):\n" + help_text())
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    ap = _KeysParser(
        prog="python -m hpctrain",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train with synchronous data-parallel SGD over MPI. Launch with "
                    "`mpiexec -n N python -m hpctrain [options]`. Other subcommands: "
                    + ", ".join(s for s in SUBCOMMANDS if s != "train") + ".")
    ap.add_argument("--config", metavar="FILE", help="TOML file with [section] tables of config keys")
    ap.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides",
                    help="override a config key, e.g. --set optim.lr=0.2 (repeatable)")
    for flag, key in FLAGS.items():
        ap.add_argument(flag, metavar="VALUE", dest=key.replace(".", "__"), help=f"same as --set {key}=VALUE")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def config_from_args(argv: list[str]) -> Config:
    """Parse argv into a validated-later :class:`Config` (raises ConfigError on bad keys/values)."""
    from hpctrain.job.config import Config, ConfigError, load_toml, set_value
    args = build_parser().parse_args(argv)
    cfg = Config()
    if args.config:
        load_toml(cfg, args.config)
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item}: expected KEY=VALUE")
        set_value(cfg, key.strip(), value.strip())
    for key in FLAGS.values():
        value = getattr(args, key.replace(".", "__"))
        if value is not None:
            set_value(cfg, key, value)
    if args.no_progress:
        set_value(cfg, "run.progress", False)
    return cfg


# The keys read before MPI and torch start, with their defaults (the schema's: a unit test holds
# them equal). The schema itself imports every registry, hence torch and MPI: too late for these.
EARLY_KEYS = {"run.run_dir": "runs/latest", "ckpt.dir": "", "train.device": "auto"}


def early_look(argv: list[str]) -> dict[str, str] | None:
    """:data:`EARLY_KEYS` as these arguments set them (the TOML file, then ``--set``, then the
    flags, as :func:`config_from_args` orders them), read without the schema; None where the
    arguments do not parse (reported later, once MPI is up, on every rank; nothing is printed
    here, not even ``--help``). The whole config is read and validated later, on every rank."""
    import contextlib
    import io
    import tomllib
    if "-h" in argv or "--help" in argv:
        return None                 # the help reads the registries (MPI's among them): printed later
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = build_parser().parse_args(argv)
        values = dict(EARLY_KEYS)
        if args.config:
            with open(args.config, "rb") as fh:
                doc = tomllib.load(fh)
            for key in EARLY_KEYS:
                section, _, name = key.partition(".")
                value = doc.get(section, {}).get(name, values[key])
                if not isinstance(value, str):
                    return None     # the schema refuses it later, with the field's name
                values[key] = value
        for item in args.overrides:
            key, sep, value = item.partition("=")
            if not sep:
                return None         # not key=value: refused later, with the item
            if key.strip() in EARLY_KEYS:
                values[key.strip()] = value.strip()
        for key in EARLY_KEYS:
            flag = getattr(args, key.replace(".", "__"), None)
            values[key] = values[key] if flag is None else flag
        return values
    except (Exception, SystemExit):
        return None
