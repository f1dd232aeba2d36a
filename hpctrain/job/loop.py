"""The training loop of the CLI's job: epochs of steps and each epoch's record. Everything around
the steps (progress bar, checkpoints, evaluation, the collapse, input, watchdog and non-finite
checks, the timeline) is an observer's (:mod:`hpctrain.job.observers`). Collective."""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from hpctrain import comm as comm_lib
from hpctrain.job.batches import device_batches, timed_batches
from hpctrain.job.observers import Observer, notify
from hpctrain.job.state import Job, Progress
from hpctrain.ops.finite import add_step_loss, epoch_loss
from hpctrain.ops.signals import StopSignal


def train(job: Job, observers: Sequence[Observer], stop: StopSignal, first_epoch: int = 0, skip: int = 0) -> Progress:
    """The epochs from ``first_epoch`` (its first ``skip`` steps done before a resume). Collective."""
    progress = Progress(start_step=job.trainer.step_count, total_steps=total_steps(job))
    progress.step, progress.lr = job.trainer.step_count, job.trainer.lr()
    notify(observers, "start", progress)
    t_train = time.perf_counter()
    for epoch in range(first_epoch, job.options.epochs):
        record = run_epoch(job, observers, stop, progress, epoch, skip if epoch == first_epoch else 0)
        progress.train_loss = record["train_loss"]
        notify(observers, "after_epoch", progress, record)
        if progress.step >= progress.total_steps or stop.agreed:
            break
    progress.stopped = bool(stop.agreed)
    notify(observers, "end", progress)
    progress.train_s = time.perf_counter() - t_train
    notify(observers, "close", progress)
    return progress


def run_epoch(job: Job, observers: Sequence[Observer], stop: StopSignal, progress: Progress, epoch: int,
              skip: int) -> dict:
    """One epoch's steps (until the run's last step or an agreed stop); its record. Collective."""
    trainer, loader = job.trainer, job.loader
    t_epoch, n, progress.epoch = time.perf_counter(), 0, epoch
    progress.epoch_loss = torch.zeros(2, device=job.device)     # [sum of finite step losses, their count]
    # Final Polishing (b): the last polish.unaugmented_epochs epochs see the data as validation does
    augment = epoch < job.options.epochs - job.options.unaugmented_epochs
    batches = loader.epoch(epoch, skip=skip, augment=augment)
    prep = loader.batch_prep(epoch, augment, skip=skip)     # nothing to do unless job.normalise_on_device
    for x, y in device_batches(timed_batches(batches, job.timer), job.device, prep):
        if trainer.step_count >= progress.total_steps:
            break
        notify(observers, "before_step", progress)
        progress.lr = trainer.lr()
        result = trainer.step(x, y)
        add_step_loss(progress.epoch_loss, result.loss)         # a step a scaler skipped may be inf
        progress.step, progress.loss, n = trainer.step_count, result.loss, n + 1
        progress.skipped += result.skipped
        progress.samples += loader.global_batch
        notify(observers, "after_step", progress)
        if stop.poll():                                         # agreed by all ranks at the same step
            break
    phases = job.timer.reset()
    for k, v in phases.items():
        progress.breakdown[k] = progress.breakdown.get(k, 0.0) + v
    loss_total = comm_lib.allreduce_sum([*progress.epoch_loss.tolist(), n], job.topo.comm)
    return {"epoch": epoch, "step": trainer.step_count, "train_loss": epoch_loss(*loss_total),
            "lr": progress.lr, "epoch_s": time.perf_counter() - t_epoch, "phases_s": phases}


def total_steps(job: Job) -> int:
    """The run's last step: its epochs' steps, or ``train.max_steps`` if fewer."""
    steps = job.loader.steps * job.options.epochs
    return min(steps, job.options.max_steps) if job.options.max_steps else steps
