"""``train.collapse_steps``: a training loss back at chance (ln(classes)) ends the run or warns
(``train.on_collapse``), checked as the steps go and at each epoch's end; and at the run's end, a
run that never left chance is judged (:mod:`hpctrain.ops.collapse`)."""
from __future__ import annotations

import dataclasses
import sys

from hpctrain.errors import TrainingCollapsed
from hpctrain.job.observers import Observer
from hpctrain.job.state import Job, Progress
from hpctrain.ops.collapse import (
    CollapseRule,
    CollapseWatch,
    chance_loss,
    ended_at_chance,
    explain_never_learned,
    learned_before,
)
from hpctrain.ops.collapse import explain as explain_collapse
from hpctrain.ops.metrics import MetricsLog, read_records
from hpctrain.optim.schedules import lr_at


class CollapseCheck(Observer):
    """Collective: every rank averages the same steps' losses and reaches the same verdict."""

    def __init__(self, job: Job, log: MetricsLog, steps: int, stop_on_collapse: bool, resumed: bool):
        self.job, self.log, self.stop_on_collapse = job, log, stop_on_collapse
        classes = job.loader.shards.index.num_classes
        self.watch = CollapseWatch(job.topo.comm, CollapseRule(chance_loss(classes), steps=steps))
        self.resumed = resumed

    def start(self, progress: Progress) -> None:
        """Resumed, the watch starts from the run's history (:func:`~hpctrain.ops.collapse.learned_before`)."""
        if self.resumed:
            topo = self.job.topo
            history = learned_before(read_records(self.job.options.run_dir), self.watch.detector.rule) \
                if topo.rank == 0 else None
            history = topo.comm.bcast(history, root=0)
            if history is not None:
                self.watch.detector.arm(*history)

    def after_step(self, progress: Progress) -> None:
        if self.watch.add(progress.step - 1, progress.loss):
            self.check()

    def after_epoch(self, progress: Progress, record: dict) -> None:
        self.check()

    def end(self, progress: Progress) -> None:
        if not progress.stopped:
            schedule = self.job.trainer.schedule
            progress.at_chance = ended_at_chance(self.watch.detector, progress.step - progress.start_step,
                                                 schedule.warmup_steps if schedule else 0)

    def check(self) -> None:
        """Collective: a collapse raises :class:`TrainingCollapsed` on every rank (``on_collapse = "stop"``)
        or prints its line once on rank 0 (``"warn"``)."""
        verdict = self.watch.flush()
        if verdict is None or self.watch.warned:
            return
        job, schedule = self.job, self.job.trainer.schedule
        line = explain_collapse(verdict, job.loader.steps, lambda s: lr_at(s, schedule) if schedule else None,
                                schedule.warmup_steps if schedule else 0, job.lr_line)
        self.log.log("collapsed", **dataclasses.asdict(verdict), message=line)
        if self.stop_on_collapse:
            raise TrainingCollapsed(line)
        self.watch.warned = True
        if job.topo.rank == 0:
            print(f"hpctrain: warning: {line} (train.on_collapse=warn: going on)", file=sys.stderr, flush=True)


def check_ended_at_chance(job: Job, progress: Progress, summary: dict, log: MetricsLog) -> None:
    """Collective, after the final checkpoint and evaluation: a run that never learned
    (:func:`~hpctrain.ops.collapse.ended_at_chance`) raises :class:`TrainingCollapsed` on every rank
    (``on_collapse = "stop"``: status 6, not "done") or prints its line on rank 0 (``"warn"``)."""
    if progress.at_chance is None:
        return
    line = explain_never_learned(progress.at_chance, chance_loss(summary["num_classes"]),
                                 summary["steps"] - progress.start_step, summary["test_accuracy"], job.lr_line)
    log.log("never_learned", smoothed_loss=progress.at_chance, steps=summary["steps"], message=line)
    if job.options.on_collapse == "stop":
        raise TrainingCollapsed(line)
    if job.topo.rank == 0:
        print(f"hpctrain: warning: {line} (train.on_collapse=warn)", file=sys.stderr, flush=True)
