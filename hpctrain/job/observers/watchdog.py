"""The watchdog sees each step start and each timed phase (:mod:`hpctrain.ops.watchdog`): a rank
that stops making progress is named, and the job ended after ``run.watchdog_abort_s``."""
from __future__ import annotations

from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress
from hpctrain.ops.metrics import StepTimer
from hpctrain.ops.watchdog import Watchdog


class WatchdogFeed(Observer):
    def __init__(self, watchdog: Watchdog, timer: StepTimer):
        self.watchdog, self.timer = watchdog, timer

    def start(self, progress: Progress) -> None:
        self.timer.sinks.append(self.watchdog)

    def before_step(self, progress: Progress) -> None:
        self.watchdog.step(progress.step)
