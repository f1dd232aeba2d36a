"""Command line: ``python -m hpctrain [SUBCOMMAND] [options]`` (``train`` when none is given).

Parses the subcommand's name and dispatches: each subcommand parses its own arguments (training's
in :mod:`hpctrain.job.args`, its entry :func:`hpctrain.job.entry.train_main`).
"""
from __future__ import annotations

import importlib
import sys

# Subcommand → "module:function(argv) -> int", imported only when used.
SUBCOMMANDS = {
    "train": "hpctrain.job.entry:train_main",
    "bench": "hpctrain.tools.bench:main",
    "simulate": "hpctrain.tools.sim.cli:main",
    "study": "hpctrain.tools.bench.study:main",
    "report": "hpctrain.ops.report:main",
    "status": "hpctrain.ops.runstate:main",
    "cluster": "hpctrain.tools.cluster:main",
    "export": "hpctrain.saved.export:main",
    "evaluate": "hpctrain.saved.evaluate:main",
}


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
