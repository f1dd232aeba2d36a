"""``run.timeline``: every rank's phases in a Chrome trace, ``RUN_DIR/timeline.json``."""
from __future__ import annotations

import os

from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress
from hpctrain.ops.metrics import StepTimer
from hpctrain.ops.timeline import Timeline, merge_and_write


class TimelineWriter(Observer):
    def __init__(self, comm, timer: StepTimer, run_dir: str):
        self.comm, self.timer, self.path = comm, timer, os.path.join(run_dir, "timeline.json")
        self.timeline = Timeline(comm)

    def start(self, progress: Progress) -> None:
        self.timer.sinks.append(self.timeline)

    def close(self, progress: Progress) -> None:
        merge_and_write(self.timeline, self.comm, self.path)     # collective
