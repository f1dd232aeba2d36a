"""The training loop of the CLI's job: epochs of steps, per-epoch records, periodic and final
checkpoints, the collapse and non-finite checks that end a run. Collective."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time

import torch

from hpctrain import comm as comm_lib
from hpctrain.job.batches import device_batches, timed_batches
from hpctrain.errors import TrainingCollapsed
from hpctrain.job.console import show_progress
from hpctrain.job.results import Progress, evaluate
from hpctrain.job.setup import Job
from hpctrain.ops.checkpoint import Checkpointer
from hpctrain.ops.collapse import CollapseRule, CollapseWatch, chance_loss, ended_at_chance, explain_never_learned
from hpctrain.ops.collapse import explain as explain_collapse
from hpctrain.ops.collapse import learned_before
from hpctrain.ops.datawait import InputWatch
from hpctrain.ops.finite import NO_SAMPLE, NonFiniteResult, add_step_loss, check_result, epoch_loss
from hpctrain.ops.metrics import MetricsLog, read_records
from hpctrain.ops.signals import StopSignal
from hpctrain.ops.timeline import Timeline, merge_and_write
from hpctrain.ops.watchdog import Watchdog, busy
from hpctrain.optim.schedules import lr_at
from hpctrain.ops.testhooks import maybe_inject


def train(job: Job, ckpt: Checkpointer, stop: StopSignal, resumed, log: MetricsLog,
          stack: contextlib.ExitStack, watchdog: Watchdog | None = None) -> Progress:
    """The epochs: steps, per-epoch log lines, periodic and final checkpoints. Collective."""
    cfg, topo, loader, trainer = job.cfg, job.topo, job.loader, job.trainer
    timeline = Timeline(topo.comm) if cfg.run.timeline else None
    job.timer.sinks += [sink for sink in (timeline, watchdog) if sink is not None]
    total_steps = loader.steps * cfg.train.epochs
    if cfg.train.max_steps:
        total_steps = min(total_steps, cfg.train.max_steps)
    progress = Progress(start_step=trainer.step_count)
    bar = None
    if topo.rank == 0 and cfg.run.progress:
        from tqdm import tqdm
        bar = stack.enter_context(tqdm(total=total_steps, initial=progress.start_step, desc=f"train x{topo.size}",
                                       unit="step", dynamic_ncols=True))
    collapse = collapse_watch(job, resumed is not None)    # a loss back at chance ends the run
    t_train = time.perf_counter()
    first_epoch, skip = (resumed.epoch, resumed.step_in_epoch) if resumed else (0, 0)
    lr = trainer.lr()
    input_watch = InputWatch(topo.comm)                   # is input the bottleneck? (per epoch, warns once)
    for epoch in range(first_epoch, cfg.train.epochs):
        t_epoch, n = time.perf_counter(), 0
        loss_acc = torch.zeros(2, device=job.device)     # [sum of finite step losses, their count]
        # Final Polishing (b): the last polish.unaugmented_epochs epochs see the data as validation does
        augment = epoch < cfg.train.epochs - cfg.polish.unaugmented_epochs
        done = skip if epoch == first_epoch else 0          # steps of this epoch before the resume
        batches = loader.epoch(epoch, skip=done, augment=augment)
        prep = loader.batch_prep(epoch, augment, skip=done)  # nothing to do unless job.raw
        for x, y in device_batches(timed_batches(batches, job.timer), job.device, prep):
            if trainer.step_count >= total_steps:
                break
            input_watch.batch_arrived()
            if watchdog:
                watchdog.step(trainer.step_count)
            maybe_inject(topo.rank, trainer.step_count)
            lr = trainer.lr()
            result = trainer.step(x, y)
            add_step_loss(loss_acc, result.loss)             # a step a scaler skipped may be inf
            log.observe("step", step=trainer.step_count, loss=result.loss, lr=lr)    # TensorBoard's, if on
            if collapse and collapse.add(trainer.step_count - 1, result.loss):
                check_collapse(job, collapse, log)
            progress.skipped += result.skipped
            n += 1
            progress.samples += loader.global_batch
            if bar:
                show_progress(bar, loss_acc, lr)
            if ckpt.due(trainer.step_count):
                with busy(watchdog, "checkpoint"):
                    ckpt.save(trainer)
            if stop.poll():                               # agreed by all ranks at the same step
                break
        if collapse:
            check_collapse(job, collapse, log)
        phases = job.timer.reset()
        for k, v in phases.items():
            progress.breakdown[k] = progress.breakdown.get(k, 0.0) + v
        loss_total = comm_lib.allreduce_sum([*loss_acc.tolist(), n], topo.comm)
        epoch_s = time.perf_counter() - t_epoch
        wait, warning = input_watch.epoch(epoch, phases.get("data", 0.0), epoch_s)    # collective
        if warning and topo.rank == 0:
            print(warning, file=sys.stderr, flush=True)
            log.log("warning", epoch=epoch, message=warning)
        rec = {"epoch": epoch, "step": trainer.step_count, "train_loss": epoch_loss(*loss_total),
               "lr": lr, "epoch_s": epoch_s, "phases_s": phases, **wait}
        if scaler := getattr(trainer.algo, "scaler", None):
            rec["loss_scale"] = scaler.scale
        if cfg.train.eval_every and (epoch + 1) % cfg.train.eval_every == 0:
            with busy(watchdog, "evaluation"):
                rec.update(evaluate(job))   # OD-SGD: scores the global weights W (trainer.finish)
        log.log("epoch", **rec)
        progress.train_loss = rec["train_loss"]
        _stop_if_nonfinite(job, ckpt, rec, f"after epoch {epoch}")
        if trainer.step_count >= total_steps or stop.agreed:
            break
    if collapse and not stop.agreed:
        progress.at_chance = ended_at_chance(collapse.detector, trainer.step_count - progress.start_step,
                                             trainer.schedule.warmup_steps if trainer.schedule else 0)
    with busy(watchdog, "checkpoint"):
        trainer.finish()
        ckpt.save(trainer)                                # the final (or signal) checkpoint
    progress.train_s = time.perf_counter() - t_train
    if timeline:
        merge_and_write(timeline, topo.comm, os.path.join(cfg.run.run_dir, "timeline.json"))
    return progress


def _stop_if_nonfinite(job: Job, ckpt: Checkpointer, rec: dict, where: str) -> None:
    """A non-finite loss in ``rec`` ends the run (:mod:`~hpctrain.ops.finite`), after a checkpoint."""
    split = "test" if math.isfinite(float(rec.get("train_loss", 0.0))) else "train"
    try:
        check_result(rec, split, ("train_loss", "test_loss", "test_accuracy"), where,
                     rec.get("test_nonfinite_sample", NO_SAMPLE))
    except NonFiniteResult:
        ckpt.save(job.trainer)                            # the weights are kept (ckpt.save finishes the update)
        raise


def collapse_watch(job: Job, resumed: bool) -> CollapseWatch | None:
    """The collapse check of ``train.collapse_steps`` (None when 0, or for a single class): chance is
    ln(classes). Resumed, it starts from the run's history (:func:`~hpctrain.ops.collapse.learned_before`)."""
    steps, classes = job.cfg.train.collapse_steps, job.loader.shards.index.num_classes
    if not steps or classes < 2:
        return None
    watch = CollapseWatch(job.topo.comm, CollapseRule(chance_loss(classes), steps=steps))
    if resumed:
        history = learned_before(read_records(job.cfg.run.run_dir), watch.detector.rule) \
            if job.topo.rank == 0 else None
        history = job.topo.comm.bcast(history, root=0)
        if history is not None:
            watch.detector.arm(*history)
    return watch


def check_collapse(job: Job, watch: CollapseWatch, log: MetricsLog) -> None:
    """Collective: a collapse raises :class:`TrainingCollapsed` on every rank (``on_collapse = "stop"``)
    or prints its line once on rank 0 (``"warn"``)."""
    verdict = watch.flush()
    if verdict is None or watch.warned:
        return
    schedule, cfg = job.trainer.schedule, job.cfg
    line = explain_collapse(verdict, job.loader.steps, lambda s: lr_at(s, schedule) if schedule else None,
                            schedule.warmup_steps if schedule else 0, job.lr_line)
    log.log("collapsed", **dataclasses.asdict(verdict), message=line)
    if cfg.train.on_collapse == "stop":
        raise TrainingCollapsed(line)
    watch.warned = True
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
    if job.cfg.train.on_collapse == "stop":
        raise TrainingCollapsed(line)
    if job.topo.rank == 0:
        print(f"hpctrain: warning: {line} (train.on_collapse=warn)", file=sys.stderr, flush=True)
