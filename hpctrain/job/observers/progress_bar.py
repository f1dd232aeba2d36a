"""``run.progress``: rank 0's tqdm bar of the run's steps, with the epoch's mean loss and the lr."""
from __future__ import annotations

import contextlib

from hpctrain.job.console import show_progress
from hpctrain.job.observers import Observer
from hpctrain.job.state import Progress


class ProgressBar(Observer):
    def __init__(self, ranks: int, stack: contextlib.ExitStack):
        self.ranks, self.stack, self.bar = ranks, stack, None

    def start(self, progress: Progress) -> None:
        from tqdm import tqdm
        self.bar = self.stack.enter_context(tqdm(total=progress.total_steps, initial=progress.start_step,
                                                 desc=f"train x{self.ranks}", unit="step", dynamic_ncols=True))

    def after_step(self, progress: Progress) -> None:
        show_progress(self.bar, progress.epoch_loss, progress.lr)
