"""The epoch's record, written to ``metrics.jsonl`` once every observer before this one has added
its fields."""
from __future__ import annotations

from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress
from hpctrain.ops.metrics import MetricsLog


class EpochRecord(Observer):
    def __init__(self, log: MetricsLog):
        self.log = log

    def after_epoch(self, progress: Progress, record: dict) -> None:
        self.log.log("epoch", **record)
