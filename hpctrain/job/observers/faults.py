"""Fault injection for the tests (``HPCTRAIN_INJECT_FAULT``, :mod:`hpctrain.ops.testhooks`):
nothing unless the variable names this rank and step."""
from __future__ import annotations

from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress
from hpctrain.ops.testhooks import maybe_inject


class FaultInjection(Observer):
    def __init__(self, rank: int):
        self.rank = rank

    def before_step(self, progress: Progress) -> None:
        maybe_inject(self.rank, progress.step)
