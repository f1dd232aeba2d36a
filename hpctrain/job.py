"""The CLI's training job: config → topology → data → model → DistributedTrainer → metrics.

The one place that knows every part. The step itself is :class:`DistributedTrainer`'s, the
same one user scripts call, so the CLI and the library API share one code path.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain import gpu_settings, kernels
from hpctrain.api import bind_device
from hpctrain.config import Config
from hpctrain.data import (ShardLoader, ShardSet, eval_batches, eval_prep, open_split_from_config, read_index,
                           train_loader_from_config)
from hpctrain.data.builtin import resolve_dataset
from hpctrain.data.plan import block_range
from hpctrain.errors import ConfigError, TrainingCollapsed, UserError
from hpctrain.batches import device_batches, timed_batches
from hpctrain.models import BUILTIN, ModelError, build_model, check_model_output
from hpctrain.ops.agree import agree, check_consistency, software_versions
from hpctrain.ops.checkpoint import Checkpointer, resume_spec
from hpctrain.ops.collapse import CollapseRule, CollapseWatch, chance_loss, learned_before
from hpctrain.ops.collapse import explain as explain_collapse
from hpctrain.ops.datawait import InputWatch
from hpctrain.ops.finite import NO_SAMPLE, NonFiniteResult, add_step_loss, check_result, epoch_loss, first_nonfinite
from hpctrain.testhooks import device_batches_forced, maybe_inject
from hpctrain.ops.metrics import MetricsLog, StepTimer, clock_for, gpu_time, read_records
from hpctrain.ops.rundir import RunDirectory
from hpctrain.ops.signals import StopSignal, Stopped
from hpctrain.ops.timeline import Timeline, merge_and_write
from hpctrain.ops.watchdog import Watchdog, busy, start_watchdog
from hpctrain.optim import optimizer_from_config, schedule_from_config
from hpctrain.optim.recipe import apply_recipe
from hpctrain.optim.schedules import describe_lr, lr_at
from hpctrain.polish import recompute_bn_stats
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer, compute_unsupported


@dataclass
class Job:
    """Everything set up for a run (what :func:`setup` returns)."""
    cfg: Config
    topo: Topology
    trainer: DistributedTrainer
    loader: ShardLoader
    test_set: ShardSet
    timer: StepTimer
    device: torch.device = torch.device("cpu")
    raw: bool = False          # batches cross as stored and are normalised on the device (raw_batches)
    lr_line: str = ""          # the start-up line's lr and why (optim.recipe = "auto": the recipe's line)

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model


def on_agreed_exit(close: Callable[[], object]) -> Callable[..., bool]:
    """An ``ExitStack`` exit callback running the collective ``close`` on a normal exit or an
    error every rank raised together (an ``agreed`` :class:`UserError`: set-up errors, stops,
    checkpoint errors, non-finite steps). Any other exception may be this rank's alone: a
    collective would then hang, so it is skipped and the abort hook ends the job."""
    def exit_(exc_type, exc, tb):
        if exc_type is None or (issubclass(exc_type, UserError) and exc_type.agreed):
            close()
        return False
    return exit_


def setup(cfg: Config, comm: MPI.Comm, stack: contextlib.ExitStack, done=None) -> Job:
    """Build every part of a run. Collective.

    Each local set-up phase is followed by :func:`agree`, so a user error on any rank stops
    every rank with one line before the next collective; the collective parts come after.
    Every part is registered on ``stack`` as soon as it exists, so it is released on every exit.
    ``done(name, 0, 0)`` after each phase (the watchdog's sink: a rank stuck in set-up is named).
    """
    done = done or (lambda name, start_s, duration_s: None)
    torch.set_num_threads(cfg.train.threads)
    topo = Topology.create(comm, cfg.comm.ranks_per_node)
    stack.push(on_agreed_exit(topo.close))
    done("topology", 0.0, 0.0)
    device = _agreed(comm, bind_device, topo, cfg.train.device)
    gpu_settings.apply(cfg.train)
    if device.type == "cuda":   # CuPy's NVRTC tried once now, not at the first kernel mid-run
        kernels.backend()
    raw = raw_batches(device)
    index = _agreed(comm, _data_index, cfg, topo)
    done("data index", 0.0, 0.0)
    loader, test_set = _agreed(comm, _open_data, cfg, topo, index, stack, raw)
    done("open data", 0.0, 0.0)
    model, optimizer, schedule, optim, recipe_line = _agreed(comm, _model_and_optimizer, cfg, index, loader, device)
    cfg = dataclasses.replace(cfg, optim=optim)          # as run (the recipe's values): checked and recorded
    done("build model", 0.0, 0.0)
    # collective, same verdict on every rank: names an odd rank out
    _agreed(comm, check_consistency, topo.comm, model, cfg.to_dict(), software(device))
    done("start-up check", 0.0, 0.0)
    timer = StepTimer(clock=clock_for(device))     # CUDA events on a GPU (what the device spends)
    trainer = DistributedTrainer.from_config(model, optimizer, topo, cfg, schedule=schedule, timer=timer)
    stack.push(on_agreed_exit(trainer.close))
    return Job(cfg, topo, trainer, loader, test_set, timer, device, raw,
               recipe_line or describe_lr(cfg.optim, loader.global_batch))


def raw_batches(device: torch.device) -> bool:
    """Whether the loader hands over raw batches that the job normalises (and augments) on
    ``device`` after the copy: on a GPU, so a uint8 batch crosses PCIe at a quarter of float32's
    bytes and the GPU does the arithmetic; on the CPU only when the tests ask (:mod:`hpctrain.testhooks`)
    (the same batches either way; the loader's thread does it, overlapped with the step)."""
    return device.type != "cpu" or device_batches_forced()


def software(device: torch.device) -> dict:
    """The versions every rank must share; on a GPU also the kernel path (CuPy's kernels on one
    rank and torch's reference on another would round differently: the start-up check names it)."""
    versions = software_versions()
    if device.type == "cuda":
        versions["kernels"] = kernels.backend()[0]
    return versions


def _agreed(comm: MPI.Comm, phase, *args):
    """Run a set-up phase; if it fails on any rank with a :class:`UserError`, every rank raises
    the same one. Any other exception is a bug: it keeps its traceback and aborts the job."""
    error, result = None, None
    try:
        result = phase(*args)
    except UserError as exc:
        error = exc
    agree(comm, error)
    return result


def _data_index(cfg: Config, topo: Topology):
    return read_index(resolve_dataset(cfg.data.dataset, cfg.data.cache_dir, topo.comm))


def _open_data(cfg: Config, topo: Topology, index, stack: contextlib.ExitStack, raw: bool = False):
    """Train loader and test split (collective opens with ``mpio``), registered on ``stack``
    at once: a check failing on one rank after the opens still closes them on every rank."""
    loader = train_loader_from_config(index, topo, cfg.data, batch_size=cfg.train.batch_size // topo.size,
                                      seed=cfg.train.seed, raw=raw)
    stack.push(on_agreed_exit(loader.close))
    test_set = open_split_from_config(index, "test", topo, cfg.data)
    stack.push(on_agreed_exit(test_set.close))
    test_set.check()
    if loader.steps == 0:
        raise ConfigError(f"config train.batch_size: global batch {cfg.train.batch_size} is larger than "
                          f"the {loader.shards.num_samples} training samples")
    return loader, test_set


def _model_and_optimizer(cfg: Config, index, loader, device: torch.device):
    """Local only (no collectives): model (on ``device``, before the optimiser sees its
    parameters), output check, optimiser, schedule."""
    why = compute_unsupported(cfg.precision.compute, device)
    if why:
        raise ConfigError(f"config precision.compute: {why}")
    torch.manual_seed(cfg.train.seed)
    m = cfg.model
    try:
        model = build_model(m.name, num_classes=index.num_classes, in_channels=index.sample_shape[0],
                            batchnorm=m.batchnorm, zero_init_residual=m.zero_init_residual)
    except (ValueError, OSError, RuntimeError, ImportError) as exc:
        if isinstance(exc, UserError) or m.name in BUILTIN:
            raise                                  # a built-in model's failure is hpctrain's bug
        raise ModelError(str(exc)) from exc        # the user's own factory failed: one line
    if device.type != "cpu":                    # built on the CPU; moved before the optimiser sees it
        model = model.to(device)
    model = gpu_settings.model_memory_format(model, cfg.train.channels_last)
    sample = next(iter(eval_batches(loader.shards, rank=0, size=1, batch_size=2)))[0].to(device)
    check_model_output(model, sample, index.num_classes, m.name)
    optim, recipe_line = apply_recipe(cfg.optim, cfg.train.batch_size, model, cfg.train.epochs)  # recipe "auto"
    optimizer = optimizer_from_config(model, optim)
    schedule = schedule_from_config(optim, global_batch=cfg.train.batch_size, steps_per_epoch=loader.steps,
                                    epochs=cfg.train.epochs)
    return model, optimizer, schedule, optim, recipe_line


def evaluate(job: Job, batch_size: int = 256) -> dict:
    """Exact accuracy and mean loss over the whole test split (each rank scores its share); with
    ``test_nonfinite_sample``, the first sample whose loss is not finite, if any (:mod:`~hpctrain.ops.finite`)."""
    topo = job.topo
    correct = loss_sum = count = 0.0
    first_bad, pos = NO_SAMPLE, block_range(job.test_set.num_samples, topo.size, topo.rank)[0]
    # every rank scores the same model: the update in flight done, rank 0's BN statistics
    pool = job.loader.jpeg.pool if job.loader.jpeg else None            # JPEG: the training loader's decode pool
    batches = eval_batches(job.test_set, rank=topo.rank, size=topo.size, batch_size=batch_size, raw=job.raw,
                           pool=pool)
    prep = eval_prep(job.test_set) if job.raw else None
    with job.trainer.evaluation() as model, torch.no_grad():
        for x, y in device_batches(batches, job.device, prep):
            out = model(x)
            losses = torch.nn.functional.cross_entropy(out, y, reduction="none")
            batch_loss = float(losses.sum())
            if not math.isfinite(batch_loss) and first_bad == NO_SAMPLE:
                first_bad = first_nonfinite(losses, pos)
            loss_sum += batch_loss
            correct += float((out.argmax(1) == y).sum())
            count += len(y)
            pos += len(y)
    correct, loss_sum, count = comm_lib.allreduce_sum([correct, loss_sum, count], topo.comm)
    result = {"test_accuracy": correct / count, "test_loss": loss_sum / count, "test_samples": int(count)}
    first_bad = topo.comm.allreduce(first_bad, op=MPI.MIN)
    return result if first_bad == NO_SAMPLE else {**result, "test_nonfinite_sample": first_bad}


def polish(job: Job) -> dict:
    """Final Polishing: BN statistics recomputed on un-augmented training data, then re-evaluated."""
    cfg = job.cfg
    batches = job.loader.epoch(cfg.train.epochs, augment=False)
    if cfg.polish.bn_batches:
        batches = itertools.islice(batches, cfg.polish.bn_batches)
    prep = job.loader.batch_prep(cfg.train.epochs, augment=False)
    with job.timer.span("polish"):
        recompute_bn_stats(job.model, device_batches(batches, job.device, prep), job.topo.comm)
    return evaluate(job)


@dataclass
class Progress:
    """What the training loop has done so far (the summary's inputs)."""
    start_step: int
    samples: int = 0
    skipped: int = 0
    train_s: float = 0.0
    breakdown: dict = field(default_factory=dict)


def startup_line(job: Job) -> str:
    """What this run chose and why, in one line: topology, device, gradient sync, effective lr."""
    return (f"hpctrain: {job.topo.describe()} | device {describe_device(job.device, job.cfg.train.device)} | "
            f"sync {job.trainer.sync.describe()} | "
            f"{job.lr_line}")


def show_progress(bar, loss_acc: torch.Tensor, lr: float | None) -> None:
    """One step on the progress bar; the mean loss is read (a host sync on a GPU: the host
    waits for the step's kernels) only when tqdm redraws, a few times a second, not every
    step (issue 34, N6). ``tqdm.update`` returns True when it redrew."""
    if bar.update(1):
        loss_sum, n = loss_acc.tolist()
        bar.set_postfix(loss=f"{loss_sum / max(n, 1):.3f}", lr=f"{lr:.3g}")


def describe_device(device: torch.device, want: str) -> str:
    """``cuda:1 (auto: local rank mod 2 visible GPUs)``, ``cpu (auto: no CUDA device)``, ``cpu``."""
    if device.type == "cuda":
        return (f"{device} ({want}: local rank mod {torch.cuda.device_count()} visible GPU(s); "
                f"kernels: {kernels.backend()[1]})")
    return f"{device} (auto: no CUDA device)" if want == "auto" else str(device)


def run(cfg: Config, comm: MPI.Comm) -> dict:
    """Train and evaluate; returns the summary (identical on every rank).

    Phases: set-up, resume, train, then stop (signal) or evaluate and summarise. Everything
    opened is registered on one ``ExitStack`` and released on every exit path — collective
    parts on a normal exit or an agreed error (:func:`on_agreed_exit`), local ones always.
    """
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        # the run directory (and a checkpoint directory of its own) is this job's alone, from here
        rundir = stack.enter_context(RunDirectory(comm, cfg.run.run_dir, cfg.ckpt.dir))
        watchdog = start_watchdog(comm, cfg.run.watchdog_s, cfg.run.watchdog_abort_s, stack, on_agreed_exit)
        # SIGTERM/SIGUSR1/SIGINT → checkpoint and stop; from here, so a signal during set-up is
        # not lost (nor fatal): it is acted on at the first step
        stop = StopSignal(comm)
        stack.push(on_agreed_exit(stop.close))
        job = setup(cfg, comm, stack, watchdog)
        cfg = job.cfg                      # the config as run (optim.recipe = "auto" applied): recorded below
        run_id = rundir.identity(job.topo.comm, fresh=not resume_spec(cfg.ckpt.resume))
        ckpt = Checkpointer.from_config(cfg, job.topo.comm, job.loader, job.timer, run_id=run_id)
        resumed = ckpt.resume(job.trainer, cfg.ckpt.resume)      # None, or where to continue
        log = stack.enter_context(contextlib.closing(
            MetricsLog(cfg.run.run_dir, enabled=job.topo.rank == 0, append=bool(resume_spec(cfg.ckpt.resume)))))
        if watchdog is not None:                                  # the run's last record says why it ended
            watchdog.on_abort = rundir.on_stall(log, lambda: job.trainer.step_count)
        if job.topo.rank == 0:
            print(startup_line(job), flush=True)
        log.log("config", config=cfg.to_dict(), run_id=run_id, world_size=job.topo.size, topology=job.topo.describe(),
                data=job.loader.describe(), test_data=job.test_set.describe(), steps_per_epoch=job.loader.steps,
                resumed_from=ckpt.last_path if resumed else None, start_step=job.trainer.step_count)
        progress = train(job, ckpt, stop, resumed, log, stack, watchdog)
        if stop.agreed:
            step, where = job.trainer.step_count, ckpt.last_path
            log.log("stopped", signal=stop.name, step=step, checkpoint=where, train_s=progress.train_s)
            rundir.record("stopped", signal=stop.name, step=step, checkpoint=where)
            raise Stopped(f"stopped by {stop.name} at step {step} after writing {where}; continue with "
                          f"--set ckpt.resume=auto")
        with busy(watchdog, "evaluation"):
            summary = summarise(job, log, progress, t0)
        rundir.record("done", steps=summary["steps"], test_accuracy=summary["test_accuracy"])
        return summary


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
        if cfg.train.eval_every and (epoch + 1) % cfg.train.eval_every == 0:
            with busy(watchdog, "evaluation"):
                rec.update(evaluate(job))   # OD-SGD: scores the global weights W (trainer.finish)
        log.log("epoch", **rec)
        _stop_if_nonfinite(job, ckpt, rec, f"after epoch {epoch}")
        if trainer.step_count >= total_steps or stop.agreed:
            break
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


def summarise(job: Job, log: MetricsLog, progress: Progress, t0: float) -> dict:
    """Final evaluation (and Final Polishing), then the summary line of metrics.jsonl. Collective."""
    cfg, topo, loader = job.cfg, job.topo, job.loader
    result = evaluate(job)
    if cfg.polish.bn_recompute:
        result = {**polish(job), "test_accuracy_before_polish": result["test_accuracy"]}
    check_result(result, "test", ("test_loss", "test_accuracy"), "in the final evaluation",
                 result.get("test_nonfinite_sample", NO_SAMPLE))
    steps, train_s, wall_s = job.trainer.step_count, progress.train_s, time.perf_counter() - t0
    epochs_here = (steps - progress.start_step) / loader.steps    # this run's share, when resumed
    return log.log("summary", **result, samples_per_s=progress.samples / train_s, wall_s=wall_s,
                   train_s=train_s, world_size=topo.size, steps=steps, epochs=steps / loader.steps,
                   global_batch=loader.global_batch, skipped_steps=int(progress.skipped),
                   num_classes=loader.shards.index.num_classes,
                   strategy=cfg.comm.strategy, compression=cfg.comm.compression, algorithm=cfg.sync.algorithm,
                   phases_s=progress.breakdown,
                   data_wait_share=progress.breakdown.get("data", 0.0) / train_s if train_s else 0.0,
                   start_step=progress.start_step, **gpu_time(wall_s, topo.size, epochs_here))
