"""Periodic checkpoints (``ckpt.every_steps``) and the final one (or a stop signal's), the
update in flight finished first (:meth:`~hpctrain.trainer.DistributedTrainer.finish`)."""
from __future__ import annotations

from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress
from hpctrain.ops.checkpoint import Checkpointer
from hpctrain.ops.watchdog import Watchdog, busy
from hpctrain.trainer import DistributedTrainer


class Checkpoints(Observer):
    def __init__(self, ckpt: Checkpointer, trainer: DistributedTrainer, watchdog: Watchdog | None):
        self.ckpt, self.trainer, self.watchdog = ckpt, trainer, watchdog

    def after_step(self, progress: Progress) -> None:
        if self.ckpt.due(progress.step):
            with busy(self.watchdog, "checkpoint"):
                self.ckpt.save(self.trainer)

    def end(self, progress: Progress) -> None:
        with busy(self.watchdog, "checkpoint"):
            self.trainer.finish()
            self.ckpt.save(self.trainer)                  # the final (or signal) checkpoint
