"""Is input the bottleneck? Each epoch's wait for batches, the slowest rank named once
(:class:`~hpctrain.ops.datawait.InputWatch`); the wait's fields go in the epoch record."""
from __future__ import annotations

import sys

from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress
from hpctrain.ops.datawait import InputWatch
from hpctrain.ops.metrics import MetricsLog


class InputWait(Observer):
    def __init__(self, comm, log: MetricsLog):
        self.watch, self.log, self.rank = InputWatch(comm), log, comm.Get_rank()

    def before_step(self, progress: Progress) -> None:
        self.watch.batch_arrived()

    def after_epoch(self, progress: Progress, record: dict) -> None:
        wait, warning = self.watch.epoch(record["epoch"], record["phases_s"].get("data", 0.0),
                                         record["epoch_s"])    # collective
        if warning and self.rank == 0:
            print(warning, file=sys.stderr, flush=True)
            self.log.log("warning", epoch=record["epoch"], message=warning)
        record.update(wait)
