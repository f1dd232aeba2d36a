"""Each step's loss and lr to the metrics log's observers (TensorBoard's, if on): too many for
``metrics.jsonl`` itself."""
from __future__ import annotations

from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress
from hpctrain.ops.metrics import MetricsLog


class StepFigures(Observer):
    def __init__(self, log: MetricsLog):
        self.log = log

    def after_step(self, progress: Progress) -> None:
        self.log.observe("step", step=progress.step, loss=progress.loss, lr=progress.lr)
