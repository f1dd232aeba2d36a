"""A non-finite loss in the epoch's record ends the run (:mod:`~hpctrain.ops.finite`), after a
checkpoint keeps the weights."""
from __future__ import annotations

import math

from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress
from hpctrain.ops.checkpoint import Checkpointer
from hpctrain.ops.finite import NO_SAMPLE, NonFiniteResult, check_result
from hpctrain.trainer import DistributedTrainer


class NonFiniteStop(Observer):
    def __init__(self, ckpt: Checkpointer, trainer: DistributedTrainer):
        self.ckpt, self.trainer = ckpt, trainer

    def after_epoch(self, progress: Progress, record: dict) -> None:
        split = "test" if math.isfinite(float(record.get("train_loss", 0.0))) else "train"
        try:
            check_result(record, split, ("train_loss", "test_loss", "test_accuracy"),
                         f"after epoch {record['epoch']}", record.get("test_nonfinite_sample", NO_SAMPLE))
        except NonFiniteResult:
            self.ckpt.save(self.trainer)              # the weights are kept (ckpt.save finishes the update)
            raise
