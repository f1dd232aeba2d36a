"""The loss scale at the end of each epoch, in its record (a run with a loss scaler)."""
from __future__ import annotations

from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress
from hpctrain.optim.loss_scale import LossScaler


class LossScaleRecord(Observer):
    def __init__(self, scaler: LossScaler):
        self.scaler = scaler

    def after_epoch(self, progress: Progress, record: dict) -> None:
        record["loss_scale"] = self.scaler.scale
