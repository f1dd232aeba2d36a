"""The CLI's training job (``python -m hpctrain``): the top of the house, the one package that
knows every part.

``args``: the command line into a Config; ``entry``: :func:`~hpctrain.job.entry.train_main`, the
exit statuses; ``schema`` and ``config``: the sections, ``--help``, TOML, ``--set``, validation,
importing every registry; ``setup``: the config read once into plain keywords, run options
(``state.RunOptions``) and observers, and every part built (``state.Job``); ``loop``: the epochs;
``observers``: what watches them (progress bar, checkpoints, evaluation, ...); ``results``:
evaluation, Final Polishing, the summary; ``console``: the start-up line; ``runner``: :func:`run`,
the phases in order.

:func:`run` is imported when first used: the entry's early look (before MPI and torch start)
imports this package.
"""
from __future__ import annotations

from typing import Any

__all__ = ["run"]


def __getattr__(name: str) -> Any:
    if name == "run":
        from hpctrain.job.runner import run
        return run
    raise AttributeError(f"module 'hpctrain.job' has no attribute {name!r}")
