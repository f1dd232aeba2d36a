"""Command line: ``python -m hpctrain [SUBCOMMAND] [options]`` (``train`` when none is given).

The entry point: ``train_main`` takes ``MPI.COMM_WORLD`` and hands it down; library code below
takes a communicator.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpctrain.job.config import Config

# Subcommand → "module:function(argv) -> int", imported only when used.
SUBCOMMANDS = {
    "train": "hpctrain.cli:train_main",
    "bench": "hpctrain.tools.bench:main",
    "simulate": "hpctrain.tools.sim.cli:main",
    "study": "hpctrain.tools.bench.study:main",
    "report": "hpctrain.ops.report:main",
    "status": "hpctrain.ops.runstate:main",
    "cluster": "hpctrain.tools.cluster:main",
    "export": "hpctrain.saved.export:main",
    "evaluate": "hpctrain.saved.evaluate:main",
}

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
        cfg.run.progress = False
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


def refused_early(early: dict[str, str] | None) -> bool:
    """Before MPI and torch (seconds of imports, a minute on a busy node): whether another job
    holds this run's directory; launcher rank 0 prints the line. The job still takes the lock
    itself later (:func:`hpctrain.ops.runlock.hold_run_dirs`): this look only refuses sooner."""
    from hpctrain.ops.runlock import held_run_dir, launcher_rank
    if early is None:
        return False
    line = held_run_dir([early["run.run_dir"]] + ([early["ckpt.dir"]] if early["ckpt.dir"] else []))
    if line and launcher_rank() in (0, None):
        print(f"hpctrain: error: {line}", file=sys.stderr, flush=True)
    return line is not None


def train_main(argv: list[str]) -> int:
    from hpctrain.ops import gpu_bind
    early = early_look(argv)
    if refused_early(early):
        return 2
    gpu_bind.early_bind(early["train.device"] if early else None)    # before MPI_Init: a CUDA-aware MPI's context
    from mpi4py import MPI

    from hpctrain.job.config import ConfigError, validate
    from hpctrain.errors import TrainingCollapsed, UserError
    from hpctrain.ops.abort import install_abort_hook
    from hpctrain.ops.agree import agree
    from hpctrain.ops.signals import Stopped
    comm = MPI.COMM_WORLD
    install_abort_hook(comm)
    try:
        cfg, error = None, None
        try:
            cfg = config_from_args(argv)
            validate(cfg, comm.Get_size())
            from hpctrain.data_tools.builtin import dataset_problem     # the config never imports the tools
            if problem := dataset_problem(cfg.data.dataset):
                raise ConfigError(f"config data.dataset: {problem}")
        except ConfigError as exc:
            error = exc
        agree(comm, error)          # a file-system check may fail on one node only: stop every rank
        assert cfg is not None              # agree raised otherwise
        from hpctrain.job import run
        summary = run(cfg, comm)
    except Stopped as exc:          # SIGTERM/SIGUSR1: checkpoint written, resumable
        if comm.Get_rank() == 0:
            print(f"hpctrain: {exc}", file=sys.stderr)
        return 3
    except TrainingCollapsed as exc:        # the loss went back to chance: not "done" (docs/operations.md)
        if comm.Get_rank() == 0:
            print(f"hpctrain: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except UserError as exc:
        if isinstance(exc, UserError) and not exc.agreed:
            raise                   # this rank's alone: the abort hook prints it and ends every rank
        if comm.Get_rank() == 0:
            print(f"hpctrain: error: {exc}", file=sys.stderr)
        return 2
    if comm.Get_rank() == 0:
        print(format_summary(summary))
    return 0


def format_summary(s: dict) -> str:
    top5 = f" (top-5 {100 * s['test_top5_accuracy']:.2f}%)" if "test_top5_accuracy" in s else ""
    return (f"test accuracy {100 * s['test_accuracy']:.2f}%{top5} | {s['samples_per_s']:.0f} samples/s | "
            f"wall {s['wall_s']:.1f} s | {s['world_size']} ranks | GPU-time {s['gpu_time_s']:.1f} s "
            f"({s['avg_single_gpu_time_per_epoch_s']:.2f} s/epoch) | {s['strategy']}/{s['compression']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"hpctrain {importlib.import_module('hpctrain').__version__}")
        return 0
    name, rest = (argv[0], argv[1:]) if argv and argv[0] in SUBCOMMANDS else ("train", argv)
    mod_name, _, fn = SUBCOMMANDS[name].partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name == mod_name:
            print(f"hpctrain: subcommand {name!r} is not available in this version", file=sys.stderr)
            return 2
        raise
    return int(getattr(mod, fn)(rest) or 0)
