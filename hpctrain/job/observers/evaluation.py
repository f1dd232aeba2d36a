"""``train.eval_every``: the test split scored every N epochs, its fields in the epoch record."""
from __future__ import annotations

from hpctrain.job.observers import Observer
from hpctrain.job.results import evaluate
from hpctrain.job.state import Job, Progress
from hpctrain.ops.watchdog import Watchdog, busy


class EpochEvaluation(Observer):
    def __init__(self, job: Job, every: int, watchdog: Watchdog | None):
        self.job, self.every, self.watchdog = job, every, watchdog

    def after_epoch(self, progress: Progress, record: dict) -> None:
        if (record["epoch"] + 1) % self.every == 0:
            with busy(self.watchdog, "evaluation"):
                record.update(evaluate(self.job))     # OD-SGD: scores the global weights W (trainer.finish)
