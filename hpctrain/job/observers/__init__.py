"""What watches the training loop (:func:`hpctrain.job.loop.train`): one small interface,
:class:`Observer`, and one module per concern.

The loop knows none of them: it calls each hook of every observer in the order
:func:`hpctrain.job.setup.observers` lists them, and that order is the order of what they print
and write. Adding one is a module here and a line in that list.
"""
from __future__ import annotations

from collections.abc import Sequence

from hpctrain.job.state import Progress


class Observer:
    """The hooks, each a no-op unless overridden. ``progress`` is the loop's position
    (:class:`~hpctrain.job.state.Progress`); ``record`` the epoch's ``metrics.jsonl`` record, which
    an observer may add fields to before the one that writes it."""

    def start(self, progress: Progress) -> None:
        """Before the first step of this run (resumed: of this run's share)."""

    def before_step(self, progress: Progress) -> None:
        """A batch is on the device; the step ``progress.step`` is about to be taken."""

    def after_step(self, progress: Progress) -> None:
        """The step is taken: ``progress.step``, ``.loss`` and ``.lr`` are its."""

    def after_epoch(self, progress: Progress, record: dict) -> None:
        """The epoch's steps are done and its loss reduced over the ranks."""

    def end(self, progress: Progress) -> None:
        """The last epoch is done (or a stop agreed: ``progress.stopped``), before the training clock stops."""

    def close(self, progress: Progress) -> None:
        """After the training clock stopped: what is not training (writing the timeline)."""


def notify(observers: Sequence[Observer], hook: str, *args) -> None:
    """Call ``hook`` of every observer, in their order."""
    for observer in observers:
        getattr(observer, hook)(*args)
