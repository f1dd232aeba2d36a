"""The arguments the benches of interleaved rounds share (``bench step``, ``bench ddp``, ``bench
compat``), parsed and checked alike, in a module of their own: ``compat`` takes them without the
training-step machinery of ``bench step``."""
from __future__ import annotations

import argparse


def comma_list(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def add_round_args(p: argparse.ArgumentParser, models: str, choices, *, configs: tuple[str, str] | None = None,
                   batch: int = 32, rounds: int = 5, warmup: int = 2, ranks_per_node: bool = True,
                   helps: dict | None = None) -> None:
    """The arguments of a bench of interleaved rounds (``step``, ``ddp``, ``compat``): ``--configs``
    (where ``configs`` gives its default and help), ``--models`` (default ``models``, from
    ``choices``), ``--batch``, ``--steps``, ``--rounds``, ``--warmup``, ``--ranks-per-node`` and
    ``--json``; ``helps`` replaces a help text by the option's name."""
    helps = {"batch": "samples per rank and step", "steps": "timed steps per contender and round",
             "rounds": "rounds (median over rounds)", "warmup": "untimed steps per contender first", **(helps or {})}
    if configs:
        p.add_argument("--configs", default=configs[0], type=comma_list, help=configs[1])
    p.add_argument("--models", default=models, type=comma_list,
                   help=f"comma-separated, from {', '.join(choices)} (default {models})")
    p.add_argument("--batch", type=int, default=batch, help=helps["batch"])
    p.add_argument("--steps", type=int, default=8, help=helps["steps"])
    p.add_argument("--rounds", type=int, default=rounds, help=helps["rounds"])
    p.add_argument("--warmup", type=int, default=warmup, help=helps["warmup"])
    if ranks_per_node:
        p.add_argument("--ranks-per-node", type=int, default=0, help="emulate K ranks per node (0: real nodes)")
    p.add_argument("--json", metavar="FILE", help="write the rows as a JSON list")


def check_round_args(p: argparse.ArgumentParser, args, choices, check_config=None,
                     positive=("batch", "steps", "rounds")):
    """``args`` of :func:`add_round_args`, or ``p.error`` with one line: known models, every
    ``--configs`` entry accepted by ``check_config`` (it raises ValueError), the ``positive``
    counts at least 1, ``--warmup`` at least 0. Returns ``args``."""
    bad = [m for m in args.models if m not in choices]
    if bad:
        p.error(f"--models: unknown {bad} (choose from {', '.join(choices)})")
    for c in args.configs if check_config else ():
        try:
            check_config(c)
        except ValueError as exc:
            p.error(str(exc))
    if min(getattr(args, k) for k in positive) < 1 or args.warmup < 0:
        flags = [f"--{k.replace('_', '-')}" for k in positive]
        p.error(f"{', '.join(flags[:-1])} and {flags[-1]} must be positive, --warmup >= 0")
    return args
