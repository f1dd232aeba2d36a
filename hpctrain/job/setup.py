"""Set-up of a run from its config: topology, device, data, model, optimiser, trainer, and the
observers of its loop.

The one place where a :class:`~hpctrain.job.config.Config` is read: into the job's own options
(:func:`run_options`), the plain keywords each library part takes, named explicitly
(:func:`trainer_keywords`, :func:`loader_keywords`, :func:`build_optimizer`, :func:`build_schedule`,
:func:`checkpointer`), and the loop's observers (:func:`observers`). Nothing after it sees a
config section. Each local phase is agreed on by every rank before the next collective
(:func:`~hpctrain.job.agreed.agreed`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

import torch
from mpi4py import MPI

from hpctrain import kernels
from hpctrain.api import bind_device
from hpctrain.comm.threads import overlap_unsupported
from hpctrain.config.plugins import plugin_options
from hpctrain.data import ShardLoader, eval_batches, open_split, read_index, train_loader
from hpctrain.data.memory import LoaderTooLarge
from hpctrain.data_tools.builtin import resolve_dataset
from hpctrain.errors import ConfigError, UserError, config_errors
from hpctrain.job import gpu_settings
from hpctrain.job.agreed import agreed, on_agreed_exit
from hpctrain.job.config import Config
from hpctrain.job.observers import Observer
from hpctrain.job.observers.checkpoints import Checkpoints
from hpctrain.job.observers.collapse import CollapseCheck
from hpctrain.job.observers.epoch_log import EpochRecord
from hpctrain.job.observers.evaluation import EpochEvaluation
from hpctrain.job.observers.faults import FaultInjection
from hpctrain.job.observers.input_watch import InputWait
from hpctrain.job.observers.loss_scale import LossScaleRecord
from hpctrain.job.observers.nonfinite import NonFiniteStop
from hpctrain.job.observers.progress_bar import ProgressBar
from hpctrain.job.observers.step_log import StepFigures
from hpctrain.job.observers.timeline import TimelineWriter
from hpctrain.job.observers.watchdog import WatchdogFeed
from hpctrain.job.state import Job, RunOptions
from hpctrain.models import BUILTIN, ModelError, build_model, check_model_output
from hpctrain.models.compiled import compile_model
from hpctrain.models.ghostbn import use_bn_groups
from hpctrain.ops.agree import check_consistency, software_versions
from hpctrain.ops.checkpoint import Checkpointer
from hpctrain.ops.metrics import MetricsLog, StepTimer, Timer, clock_for
from hpctrain.ops.testhooks import device_batches_forced
from hpctrain.ops.watchdog import Watchdog
from hpctrain.optim import make_criterion, make_optimizer
from hpctrain.optim.loss_scale import LossScaler
from hpctrain.optim.recipe import apply_recipe
from hpctrain.optim.schedules import ScheduleSpec, describe_lr, spec_from_config
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer, compute_unsupported


def run_options(cfg: Config) -> RunOptions:
    """The options the job itself acts on, read from the config once."""
    t, r = cfg.train, cfg.run
    return RunOptions(
        run_dir=r.run_dir, ckpt_dir=cfg.ckpt.dir, resume=cfg.ckpt.resume, progress=r.progress, timeline=r.timeline,
        watchdog_s=r.watchdog_s, watchdog_abort_s=r.watchdog_abort_s, tensorboard=cfg.report.tensorboard,
        device=t.device, epochs=t.epochs, max_steps=t.max_steps, eval_every=t.eval_every,
        unaugmented_epochs=cfg.polish.unaugmented_epochs, collapse_steps=t.collapse_steps,
        on_collapse=t.on_collapse, polish=cfg.polish.bn_recompute, polish_batches=cfg.polish.bn_batches,
        ckpt_every_steps=cfg.ckpt.every_steps, ckpt_keep=cfg.ckpt.keep, strategy=cfg.comm.strategy,
        compression=cfg.comm.compression, algorithm=cfg.update.algorithm, config=cfg.to_dict())


def setup(cfg: Config, comm: MPI.Comm, stack: contextlib.ExitStack, watchdog: Watchdog | None = None) -> Job:
    """Build every part of a run. Collective.

    Each local set-up phase is followed by :func:`agree`, so a user error on any rank stops
    every rank with one line before the next collective; the collective parts come after.
    Every part is registered on ``stack`` as soon as it exists, so it is released on every exit.
    The watchdog hears of each phase done: a rank stuck in set-up is named.
    """
    def done(phase: str) -> None:
        if watchdog is not None:
            watchdog(phase, 0.0, 0.0)
    torch.set_num_threads(cfg.train.threads)
    topo = Topology.create(comm, cfg.comm.ranks_per_node)
    stack.push(on_agreed_exit(topo.close))
    done("topology")
    device = agreed(comm, bind_device, topo, cfg.train.device)
    gpu_settings.apply(cudnn_benchmark=cfg.train.cudnn_benchmark, tf32=cfg.train.tf32)
    if device.type == "cuda":   # CuPy's NVRTC tried once now, not at the first kernel mid-run
        kernels.backend()
    on_device = normalises_on_device(device)
    index = agreed(comm, data_index, cfg, topo)
    done("data index")
    loader, test_set = agreed(comm, _open_data, cfg, topo, index, stack, on_device)
    done("open data")
    model, optimizer, schedule, optim, recipe_line = agreed(comm, _model_and_optimizer, cfg, index, loader, device)
    cfg = dataclasses.replace(cfg, optim=optim)          # as run (the recipe's values): checked and recorded
    done("build model")
    # collective, same verdict on every rank: names an odd rank out
    agreed(comm, check_consistency, topo.comm, model, cfg.to_dict(), software(device))
    done("start-up check")
    timer = StepTimer(clock=clock_for(device))     # CUDA events on a GPU (what the device spends)
    trainer = DistributedTrainer(model, optimizer, topo, **trainer_keywords(cfg), schedule=schedule, timer=timer)
    stack.push(on_agreed_exit(trainer.close))
    if cfg.model.compile:     # after the broadcast, in place: hooks and state_dict keys stay the model's
        agreed(comm, compile_model, model, cfg.model.compile_mode, device.type)
    return Job(run_options(cfg), topo, trainer, loader, test_set, timer, device, on_device,
               recipe_line or describe_lr(cfg.optim, loader.global_batch))


def trainer_keywords(cfg: Config) -> dict:
    """:class:`DistributedTrainer`'s keywords from the ``[comm]``, ``[update]`` and ``[precision]``
    sections and ``optim.label_smoothing`` (with a schedule and a timer of the caller's: a script
    holding a Config builds its trainer as the job does, ``DistributedTrainer(model, opt, topo,
    **trainer_keywords(cfg), schedule=...)``)."""
    c, u = cfg.comm, cfg.update
    return dict(strategy=c.strategy, compression=c.compression, bucket_mb=c.bucket_mb, overlap=c.overlap,
                tune=c.tune, comm_delay_ms=c.delay_ms, compression_options=plugin_options(c, c.compression),
                algorithm=u.algorithm, algorithm_options=plugin_options(u, u.algorithm),
                loss_fn=make_criterion(cfg.optim.label_smoothing), compute=cfg.precision.compute,
                scaler=loss_scaler(cfg.precision))


def loss_scaler(p) -> LossScaler | None:
    """The scaler of a ``[precision]`` section: ``loss_scale`` none (no scaler), dynamic, or a
    fixed number (never grows, never backs off below itself)."""
    if p.loss_scale == "none":
        return None
    if p.loss_scale == "dynamic":
        return LossScaler(init_scale=p.init_scale, growth_interval=p.growth_interval)
    value = float(p.loss_scale)
    return LossScaler(init_scale=value, growth_interval=2**62, min_scale=value, max_scale=value)


def build_optimizer(params_or_model, o) -> torch.optim.Optimizer:
    """:func:`~hpctrain.optim.make_optimizer` from an ``[optim]`` section: its shared fields named
    as the keywords, the chosen optimiser's own options from its sub-table ``[optim.<name>]`` over
    the factory's defaults; a value it refuses is a ConfigError."""
    with config_errors():
        return make_optimizer(params_or_model, name=o.name, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay,
                              nesterov=o.nesterov, exclude_1d=o.exclude_1d, lr_1d_scale=o.lr_1d_scale,
                              **plugin_options(o, o.name))


def build_schedule(o, *, global_batch: int, steps_per_epoch: int, epochs: int) -> ScheduleSpec:
    """:func:`~hpctrain.optim.spec_from_config` from an ``[optim]`` section and the run's shape;
    a value it refuses (warm-up longer than the run) is a ConfigError."""
    with config_errors():
        return spec_from_config(
            lr=o.lr, global_batch=global_batch, steps_per_epoch=steps_per_epoch, epochs=epochs,
            warmup_epochs=o.warmup_epochs, kind=o.schedule, warmup=o.warmup, optimizer=o.name,
            base_batch=o.base_batch, scale_lr=o.scale_lr, poly_power=o.poly_power, end_lr=o.end_lr,
            step_epochs=o.step_epochs, step_gamma=o.step_gamma,
            hold_epochs=None if o.hybrid_hold_epochs < 0 else o.hybrid_hold_epochs)


# train_loader's arguments and the config keys they are read from, one line each (a refusal
# naming an argument is reported with its key); batch_size: each rank's share of the global batch.
LOADER_KEYS = {
    "batch_size": "train.batch_size", "seed": "train.seed", "block_size": "data.block_size",
    "shuffle_window": "data.shuffle_window", "prefetch": "data.prefetch", "lanes": "data.lanes",
    "augment": "data.augment", "drop_last": "data.drop_last", "augment_kind": "data.augment_kind",
    "augment_flip": "data.augment_flip", "reader": "data.reader", "hdf5_driver": "data.hdf5_driver",
    "verify": "data.verify", "workers": "data.workers", "decode": "data.decode",
}


def loader_keywords(cfg: Config, ranks: int, normalise_on_device: bool = False) -> dict:
    """:func:`~hpctrain.data.train_loader`'s keywords, each read from its key in :data:`LOADER_KEYS`;
    ``raw`` batches where the job normalises them on the device."""
    keywords = {argument: _read(cfg, key) for argument, key in LOADER_KEYS.items()}
    return keywords | dict(batch_size=cfg.train.batch_size // ranks, raw=normalise_on_device)


def _read(cfg: Config, key: str):
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def checkpointer(options: RunOptions, comm: MPI.Comm, loader: ShardLoader, timer: Timer,
                 run_id: str | None) -> Checkpointer:
    """The run's :class:`Checkpointer` (``RUN_DIR/checkpoints`` unless ``ckpt.dir`` names one); the
    config it records is the whole run's."""
    directory = options.ckpt_dir or os.path.join(options.run_dir, "checkpoints")
    return Checkpointer(comm, directory, steps_per_epoch=loader.steps, global_batch=loader.global_batch,
                        config=options.config, every_steps=options.ckpt_every_steps, keep=options.ckpt_keep,
                        timer=timer, run_id=run_id, lanes=loader.lanes)


def observers(job: Job, ckpt: Checkpointer, log: MetricsLog, stack: contextlib.ExitStack,
              watchdog: Watchdog | None, resumed: bool) -> list[Observer]:
    """The loop's observers (:mod:`hpctrain.job.observers`), in the order each hook calls them:
    the order of what they print and write."""
    o, topo, scaler = job.options, job.topo, getattr(job.trainer.algo, "scaler", None)
    listed: list[Observer | None] = [
        StepFigures(log),
        CollapseCheck(job, log, o.collapse_steps, o.on_collapse == "stop", resumed)
        if o.collapse_steps and job.loader.shards.index.num_classes >= 2 else None,
        InputWait(topo.comm, log),
        TimelineWriter(topo.comm, job.timer, o.run_dir) if o.timeline else None,
        WatchdogFeed(watchdog, job.timer) if watchdog is not None else None,
        FaultInjection(topo.rank),
        ProgressBar(topo.size, stack) if o.progress and topo.rank == 0 else None,
        Checkpoints(ckpt, job.trainer, watchdog),
        LossScaleRecord(scaler) if scaler else None,
        EpochEvaluation(job, o.eval_every, watchdog) if o.eval_every else None,
        EpochRecord(log),
        NonFiniteStop(ckpt, job.trainer),
    ]
    return [observer for observer in listed if observer is not None]


def normalises_on_device(device: torch.device) -> bool:
    """Whether the loader hands over raw batches that the job normalises (and augments) on
    ``device`` after the copy: on a GPU, so a uint8 batch crosses PCIe at a quarter of float32's
    bytes and the GPU does the arithmetic; on the CPU only when the tests ask (:mod:`hpctrain.ops.testhooks`)
    (the same batches either way; the loader's thread does it, overlapped with the step)."""
    return device.type != "cpu" or device_batches_forced()


def software(device: torch.device) -> dict:
    """The versions every rank must share; on a GPU also the kernel path (CuPy's kernels on one
    rank and torch's reference on another would round differently: the start-up check names it)."""
    versions = software_versions()
    if device.type == "cuda":
        versions["kernels"] = kernels.backend()[0]
    return versions


def data_index(cfg: Config, topo: Topology):
    """The dataset's index (a built-in or plugin dataset converted first). Collective."""
    return read_index(resolve_dataset(cfg.data.dataset, cfg.data.cache_dir, topo.comm))


def _open_data(cfg: Config, topo: Topology, index, stack: contextlib.ExitStack, on_device: bool = False):
    """Train loader and test split (collective opens with ``mpio``), registered on ``stack``
    at once: a check failing on one rank after the opens still closes them on every rank."""
    try:
        loader = train_loader(index, topo, **loader_keywords(cfg, topo.size, on_device))
    except LoaderTooLarge as exc:               # the loader names its argument; the user sees the key
        raise ConfigError(f"config {LOADER_KEYS[exc.argument]}: {exc.detail}") from None
    stack.push(on_agreed_exit(loader.close))
    test_set = open_split(index, "test", topo, driver=cfg.data.hdf5_driver, verify=cfg.data.verify)
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
    why = overlap_unsupported(cfg.comm.overlap, device)
    if why:
        raise ConfigError(f"config {why}")
    torch.manual_seed(cfg.train.seed)
    m = cfg.model
    try:
        model = build_model(m.name, num_classes=index.num_classes, in_channels=index.sample_shape[0],
                            batchnorm=m.batchnorm, zero_init_residual=m.zero_init_residual)
        if m.bn_group:
            use_bn_groups(model, m.bn_group)
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
    optimizer = build_optimizer(model, optim)
    schedule = build_schedule(optim, global_batch=cfg.train.batch_size, steps_per_epoch=loader.steps,
                                    epochs=cfg.train.epochs)
    return model, optimizer, schedule, optim, recipe_line
